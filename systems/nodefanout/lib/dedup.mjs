// "Sent" marks per device in Redis: np:sent:<org>:<nid>:<token>. A push is claimed before it
// leaves (SET NX, value "pending", a 30-second lease) and marked sent once the provider has
// answered for good (value "1", 30 days), so a job that comes back (a redelivery, a retry
// after a partial failure, a router that fanned out twice) sends each device at most once.
//
// Why a lease first and not the 30-day mark at once: a sender killed between the claim and the
// send would leave a mark for a push that never left, and it would never be sent (the
// claim_before_send bug does exactly that). A lease ends on its own; the job comes back and is
// sent then (a duplicate only if the killed send had reached the device: the collapse id
// folds it there).
//
// Fail closed: a Redis error or a reply slower than the timeout throws DedupUnavailable, and
// the sender leaves the job on the queue. No offline queue and no retries inside the client: a
// command must fail now, not be replayed after the store returns.
import Redis from 'ioredis'
import * as log from './log.mjs'

export const TTL_MS = 30 * 24 * 3600 * 1000
// The dedup_short_ttl bug: an hour, a unit slip that only shows when a retry comes late.
export const SHORT_TTL_MS = 3600 * 1000
// Longer than a send can take (the providers' request timeout is 10 s); --dedup-lease.
export const LEASE_MS = 30000
const PENDING = 'pending'
const SENT = '1'

export class DedupUnavailable extends Error {}

export const dedupKey = (org, nid, token) => `np:sent:${org}:${nid}:${token}`

export class Dedup {
  constructor(url, { shortTtl = false, claimBeforeSend = false, leaseMs = LEASE_MS, timeoutMs = 1000 } = {}) {
    this.ttlMs = shortTtl ? SHORT_TTL_MS : TTL_MS
    this.leaseMs = leaseMs
    this.claimBeforeSend = claimBeforeSend
    // Keys of pushes sent whose "sent" mark the store refused: written once it answers.
    this.lateMarks = new Set()
    this.lateTimer = null
    this.redis = new Redis(url, {
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      commandTimeout: timeoutMs,
      connectTimeout: timeoutMs,
      // Keep trying to reconnect, at most a second apart, for as long as the process lives.
      retryStrategy: (attempt) => Math.min(100 * attempt, 1000),
    })
    let lastLogged = 0
    this.redis.on('error', (err) => {
      // ioredis reports every failed reconnect; once every 5 s is enough to read.
      if (Date.now() - lastLogged > 5000) {
        lastLogged = Date.now()
        log.warn('dedup store connection error', { error: err.message })
      }
    })
  }

  async command(run) {
    try {
      return await run(this.redis)
    } catch (err) {
      throw new DedupUnavailable(err.message)
    }
  }

  // {state: 'claimed'} send it; {state: 'sent'} sent before, skip; {state: 'busy', ms} another
  // sender holds the lease for ms more.
  async claim(key) {
    if (this.lateMarks.size) await this.writeLateMarks()
    const value = this.claimBeforeSend ? SENT : PENDING
    const ttl = this.claimBeforeSend ? this.ttlMs : this.leaseMs
    const set = await this.command((r) => r.set(key, value, 'PX', ttl, 'NX'))
    if (set === 'OK') return { state: 'claimed' }
    return this.peek(key)
  }

  async peek(key) {
    const [[, value], [, ms]] = await this.command((r) => r.multi().get(key).pttl(key).exec())
    if (value === SENT) return { state: 'sent' }
    // Gone between the two calls (the lease ended): free to claim on the next try.
    return { state: 'busy', ms: value === null ? 0 : Math.max(ms, 0) }
  }

  // The provider answered for good: 30 days. An error is logged, not thrown: the push is out,
  // and the lease still guards it for a while. A mark the store refused is written again as
  // soon as the store answers (before the next claim, and every second): a lease alone ended
  // 30 s after the claim, and a job of the same push redriven from the dead-letter queue after
  // a dedup outage was sent again (a loaded memorydb-outage run: 3 duplicates).
  async markSent(key) {
    if (this.claimBeforeSend) return
    try {
      await this.command((r) => r.set(key, SENT, 'PX', this.ttlMs))
    } catch (err) {
      log.count('mark_failed')
      log.warn('could not mark a push sent', { key, error: err.message })
      this.lateMarks.add(key)
      this.retryLateMarksSoon()
    }
  }

  // Writes the marks the store refused; those it refuses again wait for the next try.
  async writeLateMarks() {
    for (const key of [...this.lateMarks]) {
      try {
        await this.command((r) => r.set(key, SENT, 'PX', this.ttlMs))
        this.lateMarks.delete(key)
        log.count('late_mark_written')
      } catch {
        return
      }
    }
  }

  retryLateMarksSoon() {
    if (this.lateTimer) return
    this.lateTimer = setInterval(async () => {
      await this.writeLateMarks()
      if (!this.lateMarks.size) {
        clearInterval(this.lateTimer)
        this.lateTimer = null
      }
    }, 1000)
    this.lateTimer.unref?.()
  }

  // Best effort: a claim that cannot be released ends with its lease (or, under the
  // claim_before_send bug, keeps that device from this notification for 30 days).
  async release(key) {
    try {
      await this.command((r) => r.del(key))
    } catch (err) {
      log.count('release_failed')
      log.warn('could not release a dedup claim', { key, error: err.message })
    }
  }

  close() {
    if (this.lateTimer) clearInterval(this.lateTimer)
    this.redis.disconnect()
  }
}
