// The router: takes a broadcast from the events queue and writes one job per member of the
// author's audience to the jobs queue, a page of the audience at a time. The event is deleted
// only once every job is on the queue; a router that dies half-way leaves the event to come
// back, and the jobs written twice are sent once (the sender's per-device claims).
import * as log from './log.mjs'
import { pause } from './lifecycle.mjs'
import { jobBody, Malformed, parseEvent } from './job.mjs'

// The event is kept invisible this long per receive, and extended while a fan-out runs.
const EVENT_VISIBILITY_S = 60
const EXTEND_EVERY_MS = 20000

export async function fanOut({ store, queues, batchConcurrency }, event, message) {
  let jobs = 0
  let extended = Date.now()
  for await (const members of store.audience(event.org, event.by)) {
    const batches = []
    for (let i = 0; i < members.length; i += 10) {
      batches.push(members.slice(i, i + 10).map((to) => jobBody({ ...event, to })))
    }
    let next = 0
    const worker = async () => {
      while (next < batches.length) await queues.sendBatch('jobs', batches[next++])
    }
    await Promise.all(Array.from({ length: Math.min(batchConcurrency, batches.length) }, worker))
    jobs += members.length
    if (message && Date.now() - extended > EXTEND_EVERY_MS) {
      await queues.hide('events', message, EVENT_VISIBILITY_S)
      extended = Date.now()
    }
  }
  return jobs
}

export async function runRouter(deps, signal) {
  const { queues } = deps
  const handle = async (message) => {
    let event
    try {
      event = parseEvent(message.body)
    } catch (err) {
      if (!(err instanceof Malformed)) throw err
      log.count('quarantined')
      log.warn('malformed event quarantined', { message: message.id, reason: err.message })
      await queues.send('quarantine', message.body, { reason: err.message, from: queues.names.events })
      await queues.delete('events', message)
      return
    }
    const jobs = await fanOut(deps, event, message)
    await queues.delete('events', message)
    log.count('broadcasts')
    log.count('jobs', jobs)
    log.info('fanned out', { org: event.org, nid: event.nid, by: event.by, jobs })
  }
  while (!signal.aborted) {
    let messages
    try {
      messages = await queues.receive('events', { max: 10, waitS: 2, visibilityS: EVENT_VISIBILITY_S, signal })
    } catch (err) {
      log.warn('receiving events failed', { error: err.message })
      await pause(1000, signal)
      continue
    }
    await Promise.all(
      messages.map((m) =>
        handle(m).catch((err) => {
          // The event comes back after its visibility timeout and is fanned out again.
          log.count('fanout_failed')
          log.warn('fan-out failed, the event will come back', { message: m.id, error: err.message })
        }),
      ),
    )
  }
}
