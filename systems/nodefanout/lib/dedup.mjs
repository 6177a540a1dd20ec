// "Sent" claims per device in Redis: np:sent:<org>:<nid>:<token>, taken with SET NX before a
// push leaves, kept 30 days, so a job that comes back (a redelivery, a retry after a partial
// failure, a router that fanned out twice) sends each device at most once. The claim is
// released when a send fails in a way that will be retried.
//
// Fail closed: a Redis error or a reply slower than the timeout throws DedupUnavailable, and
// the sender leaves the job on the queue. No offline queue and no retries inside the client: a
// command must fail now, not be replayed after the store returns.
import Redis from 'ioredis'
import * as log from './log.mjs'

export const TTL_MS = 30 * 24 * 3600 * 1000
// The dedup_short_ttl bug: an hour, a unit slip that only shows when a retry comes late.
export const SHORT_TTL_MS = 3600 * 1000

export class DedupUnavailable extends Error {}

export const dedupKey = (org, nid, token) => `np:sent:${org}:${nid}:${token}`

export class Dedup {
  constructor(url, { shortTtl = false, timeoutMs = 1000 } = {}) {
    this.ttlMs = shortTtl ? SHORT_TTL_MS : TTL_MS
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

  // true: claimed, send; false: already claimed (sent before), skip.
  async claim(key) {
    try {
      return (await this.redis.set(key, '1', 'PX', this.ttlMs, 'NX')) === 'OK'
    } catch (err) {
      throw new DedupUnavailable(err.message)
    }
  }

  // Best effort: a claim that cannot be released keeps that device from this notification for
  // the TTL (logged, counted): the cost of failing closed.
  async release(key) {
    try {
      await this.redis.del(key)
    } catch (err) {
      log.count('release_failed')
      log.warn('could not release a dedup claim', { key, error: err.message })
    }
  }

  close() {
    this.redis.disconnect()
  }
}
