"""NAT traversal's services: the relay (reservations and relayed connections), AutoNAT (dial-back
checks for peers) and the hole puncher (a relayed connection made direct). Their sans-IO core is
``lattica.nat``."""
