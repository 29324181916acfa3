// A js-libp2p 2.10 node running @canvas-js/libp2p-rendezvous 0.5.2 (npm), the rendezvous client
// and, with {"server": true} as its options (argv[2]), its rendezvous point too; driven over
// stdin/stdout in JSON lines as lattica/bench/_peers/js/peer.mjs is: the first line out is its
// peer id and addrs, then {id, op, ...} in and {id, ok | error} out. It listens on 127.0.0.1
// (TCP, Noise, yamux), answers /ipfs/ping/1.0.0, and dials only the addresses it is given.
//
// The package speaks the spec's messages (Register{ns, signedPeerRecord, ttl}, signed peer
// records verified on both sides) under its own protocol id, /canvas/rendezvous/1.0.0; both of
// its classes read that id from a static field, which this script sets to the spec's
// /rendezvous/1.0.0 before the node starts. Nothing else of the package is changed.
import { createInterface } from 'node:readline'
import { RendezvousClient, rendezvousClient } from '@canvas-js/libp2p-rendezvous/client'
import { RendezvousServer, rendezvousServer } from '@canvas-js/libp2p-rendezvous/server'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { peerIdFromString } from '@libp2p/peer-id'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const PROTOCOL = '/rendezvous/1.0.0'
RendezvousClient.protocol = PROTOCOL
RendezvousServer.protocol = PROTOCOL
const options = JSON.parse(process.argv[2] ?? '{}')

const node = await createLibp2p({
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    ping: ping(),
    // no automatic registration or discovery: the test asks for each request
    rendezvous: rendezvousClient({ autoDiscover: false }),
    // its registrations in an in-memory SQLite database (better-sqlite3)
    ...(options.server ? { rendezvousServer: rendezvousServer({}) } : {})
  }
})

const client = node.services.rendezvous
// a discovered peer as the package's client gives it: the addresses its signed record holds
const found = (peer) => ({
  peer: peer.id.toString(),
  addrs: peer.addresses.filter((a) => a.isCertified).map((a) => a.multiaddr.toString())
})

const ops = {
  // client.connect(point, callback): one stream to the rendezvous point for the requests the
  // callback makes, closed when it returns
  async register ({ point, ns, ttl }) {
    return await client.connect(multiaddr(point), (p) => p.register(ns, ttl == null ? {} : { ttl }))
  },
  async discover ({ point, ns, limit }) {
    const peers = await client.connect(multiaddr(point), (p) => p.discover(ns, limit == null ? {} : { limit }))
    return { peers: peers.map(found) }
  },
  // what the package's automatic registration does: a REGISTER, then a DISCOVER on the same stream
  async register_and_discover ({ point, ns }) {
    return await client.connect(multiaddr(point), async (p) => {
      const { ttl } = await p.register(ns)
      return { ttl, peers: (await p.discover(ns)).map(found) }
    })
  },
  // The package's unregister() queues the UNREGISTER and returns; connect() then closes the
  // stream, and libp2p's close stops the pipe that may not have written it yet. A moment's wait
  // lets it out.
  async unregister ({ point, ns }) {
    await client.connect(multiaddr(point), async (p) => {
      await p.unregister(ns)
      await new Promise((resolve) => setTimeout(resolve, 200))
    })
    return {}
  },
  // dial a peer by its id alone, at the addresses the node learned (from a discovery)
  async dial_peer ({ peer }) {
    const conn = await node.dial(peerIdFromString(peer))
    return { peer: conn.remotePeer.toString(), addr: conn.remoteAddr.toString() }
  },
  async stop () {
    await node.stop()
    setImmediate(() => process.exit(0))
    return {}
  }
}

process.stdout.write(JSON.stringify({ peer: node.peerId.toString(), addrs: node.getMultiaddrs().map(String) }) + '\n')

for await (const line of createInterface({ input: process.stdin })) {
  const { id, op, ...args } = JSON.parse(line)
  ops[op](args).then(
    (ok) => process.stdout.write(JSON.stringify({ id, ok }) + '\n'),
    (error) => process.stdout.write(JSON.stringify({ id, error: `${error.name}: ${error.message}` }) + '\n')
  )
}
await node.stop()
