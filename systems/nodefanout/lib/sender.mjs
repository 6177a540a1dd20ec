// The sender: one job per recipient. Per job: read it (a malformed one, or one whose
// notification id is no ULID, goes to the quarantine queue, never to a provider); the member's
// profile and live devices, read now from the store; consent (default deny); quiet hours in
// the member's zone (the job is hidden until the window ends); then per device: a Retry-After
// still running for its provider (wait), the claim in Redis (a lease, fail closed), the push,
// and the 30-day "sent" mark once the provider answered for good. The job is deleted once
// every device has a final outcome (sent, sent before, dead, refused for good); otherwise it
// is left to come back after the longest wait it needs.
import * as log from './log.mjs'
import { pause } from './lifecycle.mjs'
import { consent } from './consent.mjs'
import { DedupUnavailable, dedupKey } from './dedup.mjs'
import { projectFor } from './fcm.mjs'
import { Malformed, parseJob } from './job.mjs'
import { quietRemaining } from './quiet-hours.mjs'
import { backoffS, Pauses } from './retry-after.mjs'

// A job waits out a Retry-After this short in hand (its visibility extended) rather than going
// back to the queue, where every receive counts towards the dead-letter queue.
const HOLD_MAX_MS = 30000
// A member whose zone the runtime does not know: try again in 15 minutes (the API refuses such
// a zone; this is for data written before a zone was retired).
const UNKNOWN_ZONE_DEFER_S = 900
// Another copy of the job holds the device's lease: it is usually a redelivered copy being
// sent right now, done in milliseconds. Wait this long in hand for its mark before giving the
// job back for the rest of the lease (a sender that died mid-send).
const BUSY_WAIT_MS = 2000

const DEAD_RECENT_MS = 3000

export class Sender {
  constructor({ config, store, queues, dedup, apns, fcm, now = () => Date.now() }) {
    Object.assign(this, { config, store, queues, dedup, apns, fcm, now })
    this.pauses = new Pauses()
    // Tokens a provider answered dead, as this process heard it, and when: a job that read its
    // devices before the dead mark was written must not send to it (a loaded smoke run sent
    // 0.7 s after the 410, the other job's claim taking that long). Only for DEAD_RECENT_MS:
    // past that every job reads the mark, and a device registered again is sent to again.
    this.dead = new Map()
  }

  bug(name) {
    return this.config.bugs.has(name)
  }

  async handle(message, signal) {
    let job
    try {
      job = parseJob(message.body, { checkId: !this.bug('no_id_check') })
    } catch (err) {
      if (!(err instanceof Malformed)) throw err
      log.count('quarantined')
      log.warn('malformed job quarantined', { message: message.id, reason: err.message })
      // Quarantined first, then deleted: a crash between the two leaves a copy in each, never
      // none.
      await this.queues.send('quarantine', message.body, { reason: err.message, from: this.queues.names.jobs })
      await this.queues.delete('jobs', message)
      return
    }
    let profile, devices
    try {
      ;[profile, devices] = await Promise.all([this.store.profile(job.org, job.to), this.store.devices(job.org, job.to)])
    } catch (err) {
      log.count('store_unavailable')
      log.warn('member store unavailable, job left on the queue', { nid: job.nid, error: err.message })
      return this.queues.hide('jobs', message, backoffS(message.receives))
    }
    const allowed = consent(profile, { defaultAllow: this.bug('consent_default_allow') })
    if (!allowed.ok) {
      log.count('denied')
      log.info('not sent', { org: job.org, to: job.to, nid: job.nid, why: allowed.why })
      return this.queues.delete('jobs', message)
    }
    const zone = this.bug('quiet_hours_utc') ? 'UTC' : profile?.tz || 'UTC'
    let quietS
    try {
      quietS = quietRemaining(profile?.doNotDisturb, zone, this.now())
    } catch (err) {
      if (!(err instanceof RangeError)) throw err
      log.count('unknown_zone')
      log.warn('unknown time zone, deferred', { org: job.org, to: job.to, zone })
      return this.queues.defer('jobs', message, UNKNOWN_ZONE_DEFER_S)
    }
    if (quietS !== null) {
      log.count('deferred')
      log.info('deferred for quiet hours', { org: job.org, to: job.to, nid: job.nid, seconds: Math.ceil(quietS) + 1 })
      return this.queues.defer('jobs', message, Math.ceil(quietS) + 1)
    }
    const live = devices.filter((d) => d.state === 'live')
    if (!live.length) {
      log.count('no_device')
      return this.queues.delete('jobs', message)
    }
    const results = await Promise.all(live.map((device) => this.deliver(job, device, message, signal)))
    const waits = results.filter((r) => !r.final).map((r) => r.waitS)
    if (!waits.length) return this.queues.delete('jobs', message)
    return this.queues.hide('jobs', message, Math.max(...waits))
  }

  scopeOf(job, device) {
    if (device.kind === 'apple') return { provider: 'apns', scope: 'apns' }
    const project = projectFor(job.to, job.nid, this.config.fcmProjects, { unstable: this.bug('unstable_fcm_project') })
    return { provider: 'fcm', project, scope: `fcm:${project}` }
  }

  // One device's push; {final: true} or {final: false, waitS}.
  async deliver(job, device, message, signal) {
    const { provider, project, scope } = this.scopeOf(job, device)
    if (!this.bug('retry_after_ignored')) {
      for (let wait = this.pauses.remaining(scope); wait > 0; wait = this.pauses.remaining(scope)) {
        if (wait > HOLD_MAX_MS || signal?.aborted) return { final: false, waitS: wait / 1000 }
        log.count('held')
        await this.queues.hide('jobs', message, wait / 1000 + this.config.visibilityTimeout)
        await pause(wait, signal)
      }
    }
    const key = dedupKey(job.org, job.nid, device.token)
    try {
      let claim = await this.dedup.claim(key)
      for (let waited = 0; claim.state === 'busy' && waited < BUSY_WAIT_MS; waited += 100) {
        await pause(100, signal)
        claim = await this.dedup.peek(key)
        if (claim.state === 'busy' && claim.ms === 0) claim = await this.dedup.claim(key)
      }
      if (claim.state === 'sent') {
        log.count('duplicate')
        return { final: true }
      }
      if (claim.state === 'busy') {
        log.count('busy')
        return { final: false, waitS: claim.ms / 1000 + 1 }
      }
    } catch (err) {
      if (!(err instanceof DedupUnavailable)) throw err
      log.count('dedup_unavailable')
      if (!this.bug('dedup_fail_open')) {
        log.warn('dedup store unavailable, job left on the queue', { nid: job.nid, error: err.message })
        return { final: false, waitS: backoffS(message.receives) }
      }
      log.warn('dedup store unavailable, sending anyway', { nid: job.nid, error: err.message })
    }
    // A token answered dead while this job waited (its devices were read before the mark).
    const deadAt = this.dead.get(`${job.org}\n${device.token}`)
    if (deadAt !== undefined && this.now() - deadAt < DEAD_RECENT_MS) {
      await this.dedup.release(key)
      log.count('dead_skipped')
      return { final: true }
    }
    // Asked again at the last moment: the claim above took a store round trip (or a wait for a
    // busy lease), time enough for another job's answer to pause this scope; a request sent now
    // would land inside that Retry-After (game-day under load: 84 such requests).
    const late = this.bug('retry_after_ignored') ? 0 : this.pauses.remaining(scope)
    if (late > 0) {
      await this.dedup.release(key)
      log.count('held')
      return { final: false, waitS: late / 1000 }
    }
    const push = { token: device.token, org: job.org, nid: job.nid, by: job.by, verb: job.verb }
    const outcome = provider === 'apns' ? await this.apns.send(push) : await this.fcm.send(project, push)
    return this.settle(job, device, key, scope, outcome, message)
  }

  async settle(job, device, key, scope, outcome, message) {
    const where = { org: job.org, to: job.to, nid: job.nid, scope, status: outcome.status, reason: outcome.reason }
    switch (outcome.kind) {
      case 'sent':
        await this.dedup.markSent(key)
        log.count('sent')
        return { final: true }
      case 'dead':
        this.dead.set(`${job.org}\n${device.token}`, this.now())
        if (this.dead.size > 10000) {
          for (const [token, at] of this.dead) if (this.now() - at >= DEAD_RECENT_MS) this.dead.delete(token)
        }
        try {
          await this.store.markDead(job.org, job.to, device.token, `${outcome.status} ${outcome.reason}`)
        } catch (err) {
          // Not marked: free the claim so the next try asks again and marks it then.
          await this.dedup.release(key)
          log.warn('could not mark a dead device', { ...where, error: err.message })
          return { final: false, waitS: backoffS(message.receives) }
        }
        await this.dedup.markSent(key)
        log.count('dead')
        log.info('device dead, never sent to again', where)
        return { final: true }
      case 'rejected':
        await this.dedup.markSent(key)
        log.count('rejected')
        log.warn('push refused for good', where)
        return { final: true }
      default: {
        // retry or auth: nothing reached the device (as far as the answer says); the claim is
        // freed for the next try.
        await this.dedup.release(key)
        log.count(outcome.kind === 'auth' ? 'auth_retry' : 'retry')
        let waitS = outcome.kind === 'auth' ? 1 : backoffS(message.receives)
        if (outcome.retryAfterS !== null && outcome.retryAfterS !== undefined && !this.bug('retry_after_ignored')) {
          this.pauses.pause(scope, outcome.retryAfterS, this.now())
          waitS = Math.max(waitS, this.pauses.remaining(scope, this.now()) / 1000)
        }
        log.info('push to retry', { ...where, waitS })
        return { final: false, waitS }
      }
    }
  }
}

export async function runSender(deps, signal) {
  const sender = new Sender(deps)
  const { queues, config } = deps
  const loop = async () => {
    while (!signal.aborted) {
      let messages
      try {
        messages = await queues.receive('jobs', { max: 10, waitS: 2, visibilityS: config.visibilityTimeout, signal })
      } catch (err) {
        log.warn('receiving jobs failed', { error: err.message })
        await pause(1000, signal)
        continue
      }
      await Promise.all(
        messages.map((m) =>
          sender.handle(m, signal).catch((err) => {
            // A queue or store call failed: the job comes back after its visibility timeout.
            log.count('job_failed')
            log.warn('job failed, it will come back', { message: m.id, error: err.message })
          }),
        ),
      )
    }
  }
  await Promise.all(Array.from({ length: config.loops }, loop))
}
