// Starts dynalite (DynamoDB) or kinesalite (Kinesis) bound to one host, in memory.
// Usage: node aws_emulator.js dynalite|kinesalite --host 127.0.0.1 --port N
'use strict'
const path = require('path')
const argv = require('minimist')(process.argv.slice(2))
const kind = argv._[0]
const options = {
  dynalite: { createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 },
  kinesalite: { createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000 },
}[kind]
if (!options) {
  console.error(`error: unknown emulator ${JSON.stringify(kind)}; use dynalite or kinesalite`)
  process.exit(2)
}
const host = argv.host || '127.0.0.1'
const port = Number(argv.port)
const root = process.env.FANOUT_NODE_MODULES || path.join(__dirname, '..', '..', 'node_modules')
// A client killed mid-request (kill -9 of a worker is one of our faults) aborts the socket, and
// dynalite rethrows that from a request 'error' handler, which would take the whole emulator
// down and blame the system under test for a DynamoDB outage that never happened. An aborted
// request only concerns its own client: log it and keep serving. Anything else still exits.
process.on('uncaughtException', (err) => {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error(`${kind}: a client aborted its request (${err.code || err.message}); still serving`)
    return
  }
  console.error(err)
  process.exit(1)
})
const server = require(path.join(root, kind))(options)
server.on('error', (err) => {
  if (err.code === 'EADDRINUSE') console.error(`error: port ${port} on ${host} is already in use`)
  else console.error(`error: ${kind} failed: ${err.message}`)
  process.exit(2)
})
server.listen(port, host, () => console.log(`${kind} listening on http://${host}:${port}`))
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0))
