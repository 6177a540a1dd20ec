// What every role shares as a process: a pid file a team's shell commands read (kill, kill
// -STOP, kill -CONT), and a stop on SIGTERM/SIGINT that lets the work in hand finish.
import { renameSync, unlinkSync, writeFileSync } from 'node:fs'
import * as log from './log.mjs'

export function writePidFile(path) {
  if (!path) return
  // Written whole or not at all: a kill command must never read half a pid.
  const tmp = `${path}.${process.pid}.tmp`
  writeFileSync(tmp, `${process.pid}\n`)
  renameSync(tmp, path)
}

function removePidFile(path) {
  if (!path) return
  try {
    unlinkSync(path)
  } catch {
    // already gone (an operator cleaned up): nothing to undo
  }
}

// An AbortController aborted on the first SIGTERM/SIGINT; `stop` runs then, and the process
// exits 0 when it returns (1 when it throws). A second signal exits at once.
export function onStop(pidFile, stop) {
  const controller = new AbortController()
  let stopping = false
  const handler = async (signal) => {
    if (stopping) process.exit(1)
    stopping = true
    log.info('stopping', { signal, counts: log.counts })
    controller.abort()
    let code = 0
    try {
      await stop()
    } catch (err) {
      log.error('stop failed', { error: String(err) })
      code = 1
    }
    removePidFile(pidFile)
    process.exit(code)
  }
  process.on('SIGTERM', handler)
  process.on('SIGINT', handler)
  return controller.signal
}

// Resolves after ms, or at once when the signal aborts.
export function pause(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve()
    const timer = setTimeout(done, ms)
    function done() {
      clearTimeout(timer)
      signal?.removeEventListener('abort', done)
      resolve()
    }
    signal?.addEventListener('abort', done, { once: true })
  })
}
