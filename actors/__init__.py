"""The built-in system actors (installed as lattica.actors); they arrive with the actor runtime."""
