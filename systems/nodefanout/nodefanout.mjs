#!/usr/bin/env node
// node systems/nodefanout/nodefanout.mjs {api|router|sender} [options]   (--help for the list)
//
// One role a process, so a team can kill, start, pause (SIGSTOP) and resume (SIGCONT) each
// through its --pid-file. Prints one line on stdout when ready ("nodefanout <role> ready ...").
// Exit 0 after SIGTERM/SIGINT (work in hand finished), 2 for a bad command line or a taken
// port, 1 when its tables or queues cannot be made.
import { BadConfig, configFromArgs, usage } from './lib/config.mjs'
import { onStop, pause, writePidFile } from './lib/lifecycle.mjs'
import * as log from './lib/log.mjs'
import { Queues } from './lib/queue.mjs'
import { Store } from './lib/store.mjs'

const [role, ...rest] = process.argv.slice(2)
let config
try {
  config = configFromArgs(role, rest)
} catch (err) {
  if (!(err instanceof BadConfig)) throw err
  process.stderr.write(`nodefanout: error: ${err.message}\n${usage(role)}\n`)
  process.exit(2)
}
if (config.help) {
  process.stdout.write(usage(role) + '\n')
  process.exit(0)
}
log.setRole(role)
// The SDK warns at every client it builds that its releases after January 2027 need Node 22;
// ours are pinned (package-lock.json), and the warning would fill every role's log.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true'
writePidFile(config.pidFile)
if (config.bugs.size) log.warn('planted bugs on', { bugs: [...config.bugs] })

// Tables and queues, tried for 30 s: the stores may still be starting beside us.
async function provision(store, queues) {
  for (let attempt = 1; ; attempt++) {
    try {
      await store.ensureTables()
      await queues.ensure()
      return
    } catch (err) {
      if (attempt >= 30) {
        log.error('cannot create tables or queues', { error: err.message })
        process.exit(1)
      }
      await pause(1000)
    }
  }
}

const store = new Store(config)
const queues = new Queues(config)
await provision(store, queues)

if (role === 'api') {
  const { makeApi } = await import('./lib/api.mjs')
  const server = makeApi({ store, queues })
  server.on('error', (err) => {
    log.error('cannot listen', { error: err.message })
    process.stderr.write(`nodefanout: error: cannot listen on ${config.host}:${config.port}: ${err.code}\n`)
    process.exit(2)
  })
  server.listen(config.port, config.host, () => {
    process.stdout.write(`nodefanout api ready on http://${config.host}:${config.port}\n`)
  })
  onStop(config.pidFile, () => new Promise((resolve) => server.close(resolve)))
} else {
  let deps = { config, store, queues, batchConcurrency: config.batchConcurrency }
  let run
  if (role === 'router') {
    ;({ runRouter: run } = await import('./lib/router.mjs'))
  } else {
    const { Dedup } = await import('./lib/dedup.mjs')
    const { Apns } = await import('./lib/apns.mjs')
    const { Fcm } = await import('./lib/fcm.mjs')
    const { runSender } = await import('./lib/sender.mjs')
    const dedup = new Dedup(config.dedupRedis, {
      shortTtl: config.bugs.has('dedup_short_ttl'),
      claimBeforeSend: config.bugs.has('claim_before_send'),
      leaseMs: config.dedupLeaseMs,
    })
    deps = { ...deps, dedup, apns: new Apns(config), fcm: new Fcm(config) }
    run = runSender
  }
  let done
  const signal = onStop(config.pidFile, async () => {
    await done
    deps.dedup?.close()
    deps.apns?.close()
    store.close()
    queues.close()
  })
  done = run(deps, signal)
  process.stdout.write(`nodefanout ${role} ready (queues ${queues.names.events}, ${queues.names.jobs})\n`)
  await done
}
