// A js-libp2p node for the interop tests and `lattica bench libp2p`, driven over stdin/stdout in
// JSON lines: it listens on 127.0.0.1 (TCP and QUIC), echoes every byte on the test's echo
// protocol, swallows the bench's sink protocol, and runs what it is asked ({id, op, ...} in,
// {id, ok | error} out). The first line out is its peer id and addrs. With {"gossipsub": true}
// as its options (argv[2]) it also runs libp2p GossipSub (/meshsub/1.2.0, 1.1.0; StrictSign).
import { createHash, randomBytes } from 'node:crypto'
import { createInterface } from 'node:readline'
import { noise } from '@chainsafe/libp2p-noise'
import { quic } from '@chainsafe/libp2p-quic'
import { yamux } from '@chainsafe/libp2p-yamux'
import { gossipsub } from '@libp2p/gossipsub'
import { identify, identifyPush } from '@libp2p/identify'
import { peerIdFromString } from '@libp2p/peer-id'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const ECHO = '/lattica-test/echo/1.0.0'
// the bench's sink: an 8-byte big-endian length, that many bytes, then the sink answers one byte
const SINK = '/lattica-bench/sink/1.0.0'
const PING = '/ipfs/ping/1.0.0'
const options = JSON.parse(process.argv[2] ?? '{}')

const node = await createLibp2p({
  // options.listen: a NAT lab's host address instead of loopback
  addresses: { listen: options.listen ?? ['/ip4/127.0.0.1/tcp/0', '/ip4/127.0.0.1/udp/0/quic-v1'] },
  transports: [tcp(), quic()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify({ protocolPrefix: options.protocolPrefix ?? 'ipfs' }),
    identifyPush: identifyPush(),
    ping: ping(),
    // only when asked: the other tests' js peer stays as it was (no /meshsub in its identify).
    // GossipSub's defaults otherwise: StrictSign, flood publish, /meshsub/1.2.0, 1.1.0, 1.0.0
    // and /floodsub/1.0.0; emitSelf off, so `messages` holds only what others published
    ...(options.gossipsub ? { pubsub: gossipsub({ emitSelf: false }) } : {})
  },
  connectionManager: { inboundConnectionThreshold: 1000, maxIncomingPendingConnections: 1000 },
  connectionMonitor: { enabled: false }
})

const identified = []
node.addEventListener('peer:identify', (event) => {
  const { peerId, protocols, agentVersion, protocolVersion, listenAddrs, signedPeerRecord, connection } = event.detail
  identified.push({
    peer: peerId.toString(),
    protocols,
    agent: agentVersion,
    protocolVersion,
    listenAddrs: listenAddrs.map(String),
    signedAddrs: signedPeerRecord == null ? null : signedPeerRecord.addresses.map(String),
    transport: connection.remoteAddr.toString().includes('/quic-v1') ? 'quic' : 'tcp'
  })
})

// The wall clock in ns, as a BigInt: performance.timeOrigin (the wall clock when the process
// started, CLOCK_REALTIME, to the us) plus performance.now() since (the monotonic clock, sub-us).
// Date.now() has only ms; summed as one double of ms the sum would keep only ~0.25 us.
const originUs = BigInt(Math.round(performance.timeOrigin * 1e3))
const wallNs = () => originUs * 1000n + BigInt(Math.round(performance.now() * 1e6))

// GossipSub messages received, per topic, until `messages` takes them; t_ns: when the 'message'
// event reached us (wallNs, as a decimal string)
const received = new Map()
node.services.pubsub?.addEventListener('message', (event) => {
  const t = wallNs()
  const { topic, from, sequenceNumber, data } = event.detail
  if (!received.has(topic)) received.set(topic, [])
  received.get(topic).push({
    from: from?.toString() ?? null,
    // the 8-byte big-endian seqno, as it was on the wire
    seqno_hex: sequenceNumber == null ? null : sequenceNumber.toString(16).padStart(16, '0'),
    data_hex: Buffer.from(data).toString('hex'),
    t_ns: t.toString()
  })
})

// `lattica bench gossipsub-mixed`'s publisher: count messages of size bytes on topic, the i-th at
// start_ns + i * gap_ns on the wall clock (or as soon as the loop lets it), each stamped just
// before publish() with its wallNs (8 bytes, big-endian), then tag (1 byte) and i (4 bytes)
let pacing = Promise.resolve({ published: 0, errors: [] })
async function publishPaced ({ topic, start_ns: startNs, gap_ns: gapNs, count, tag, size }) {
  let published = 0
  const errors = []
  for (let i = 0; i < count; i++) {
    const wait = Number(BigInt(startNs) + BigInt(i) * BigInt(gapNs) - wallNs()) / 1e6
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    const data = Buffer.alloc(size)
    data.writeBigUInt64BE(wallNs(), 0)
    data.writeUInt8(tag, 8)
    data.writeUInt32BE(i, 9)
    try {
      await node.services.pubsub.publish(topic, data)
      published++
    } catch (error) {
      errors.push(`${error.name}: ${error.message}`)
    }
  }
  return { published, errors: errors.slice(0, 5) }
}

await node.handle(ECHO, async (stream) => {
  for await (const chunk of stream) {
    if (!stream.send(chunk)) await stream.onDrain()
  }
  await stream.close()
}, { maxInboundStreams: 64 })

await node.handle(SINK, async (stream) => {
  let head = Buffer.alloc(0)
  let want = -1
  let got = 0
  for await (const chunk of stream) {
    got += chunk.byteLength
    if (want < 0) {
      head = Buffer.concat([head, chunk.subarray()])
      if (head.length >= 8) want = Number(head.readBigUInt64BE(0)) + 8
    }
    if (want >= 0 && got >= want) break
  }
  stream.send(Uint8Array.of(107))
  await stream.close()
}, { maxInboundStreams: 64 })

// the bench's figures, timed here so that js -> js and js -> another responder share one method
const bench = {
  // fresh connections, dial to ready (Noise + yamux, or QUIC's TLS), closed before the next
  async handshake ({ addr, count }) {
    const ms = []
    for (let i = 0; i < count; i++) {
      const t0 = performance.now()
      const connection = await node.dial(multiaddr(addr), { force: true })
      ms.push(performance.now() - t0)
      await connection.close()
    }
    return { ms }
  },
  // round trips of 32 bytes on one /ipfs/ping/1.0.0 stream
  async ping ({ addr, count }) {
    const stream = await node.dialProtocol(multiaddr(addr), PING)
    const chunks = stream[Symbol.asyncIterator]()
    const us = []
    for (let i = 0; i < count; i++) {
      const payload = randomBytes(32)
      const t0 = performance.now()
      stream.send(payload)
      let got = 0
      while (got < 32) {
        const { value, done } = await chunks.next()
        if (done) throw new Error('the ping stream ended')
        got += value.byteLength
      }
      us.push((performance.now() - t0) * 1e3)
    }
    await stream.close()
    return { us }
  },
  // one stream, one direction: size bytes to the responder's sink, first byte to its answer
  async sink ({ addr, size }) {
    const stream = await node.dialProtocol(multiaddr(addr), SINK)
    const block = randomBytes(1 << 20)
    const header = Buffer.alloc(8)
    header.writeBigUInt64BE(BigInt(size))
    const t0 = performance.now()
    stream.send(header)
    for (let n = 0; n < size; n += block.length) {
      const part = size - n < block.length ? block.subarray(0, size - n) : block
      if (!stream.send(part)) await stream.onDrain()
    }
    for await (const chunk of stream) if (chunk.byteLength) break
    const seconds = (performance.now() - t0) / 1e3
    await stream.close()
    return { seconds }
  }
}

async function echo ({ addr, size }) {
  const stream = await node.dialProtocol(multiaddr(addr), ECHO)
  const sent = createHash('sha256')
  const got = createHash('sha256')
  const block = randomBytes(1 << 20)
  let received = 0
  const reading = (async () => {
    for await (const chunk of stream) {
      const bytes = chunk.subarray()
      got.update(bytes)
      received += bytes.length
      if (received >= size) break
    }
  })()
  for (let n = 0; n < size; n += block.length) {
    sent.update(block)
    if (!stream.send(block)) await stream.onDrain()
  }
  await reading
  await stream.close()
  return { sent: sent.digest('hex'), got: got.digest('hex'), received }
}

const ops = {
  async dial ({ addr }) {
    const connection = await node.dial(multiaddr(addr))
    return { peer: connection.remotePeer.toString() }
  },
  async ping ({ addr, peer }) {
    return { rtt: await node.services.ping.ping(addr ? multiaddr(addr) : peerIdFromString(peer)) }
  },
  async identified ({ peer }) {
    return { identified: identified.filter((i) => i.peer === peer) }
  },
  async connections ({ peer }) {
    return { connections: node.getConnections(peerIdFromString(peer)).map((c) => c.remoteAddr.toString()) }
  },
  echo,
  // GossipSub (the node runs it only with {"gossipsub": true}; otherwise these fail)
  async subscribe ({ topic }) {
    node.services.pubsub.subscribe(topic)
    return {}
  },
  // how many peers js sent it to; an error (PublishError.NoPeersSubscribedToTopic) if none
  async publish ({ topic, data_hex: dataHex }) {
    const { recipients } = await node.services.pubsub.publish(topic, Buffer.from(dataHex, 'hex'))
    return { recipients: recipients.length }
  },
  // the peers js knows subscribe to topic, and those of them in its mesh for topic
  async peers ({ topic }) {
    const pubsub = node.services.pubsub
    return { subscribers: pubsub.getSubscribers(topic).map(String), mesh: pubsub.getMeshPeers(topic).map(String) }
  },
  // the messages received on topic since the last call (and forgets them)
  async messages ({ topic }) {
    const messages = received.get(topic) ?? []
    received.delete(topic)
    return { messages }
  },
  // start the paced publisher (above) and answer at once; `paced_done` waits for it to finish
  async paced (args) {
    pacing = publishPaced(args)
    return {}
  },
  async paced_done () {
    return await pacing
  },
  // the wall clock as the 'message' events and the paced publisher read it
  async clock () {
    return { t_ns: wallNs().toString() }
  },
  async bench ({ what, ...args }) {
    return bench[what](args)
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
