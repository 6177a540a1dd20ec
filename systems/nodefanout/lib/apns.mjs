// APNs over HTTP/2 with Node's http2 module: one long-lived connection (TLS, trusting the CA
// file given; h2c for an http:// URL), token-based auth with an ES256 JWT signed with
// node:crypto from the team's .p8 key.
import { createPrivateKey, sign } from 'node:crypto'
import { readFileSync } from 'node:fs'
import http2 from 'node:http2'
import { retryAfterSeconds } from './retry-after.mjs'

const b64url = (data) => Buffer.from(data).toString('base64url')
// Apple rejects a token older than an hour and throttles one refreshed more often than every
// 20 minutes: renew at 50, and never sooner than 20 even when APNs says it expired.
const TOKEN_MAX_AGE_MS = 50 * 60 * 1000
const TOKEN_MIN_AGE_MS = 20 * 60 * 1000
const REQUEST_TIMEOUT_MS = 10000

export class ProviderToken {
  constructor(keyPem, keyId, teamId, now = () => Date.now()) {
    this.key = createPrivateKey(keyPem)
    this.keyId = keyId
    this.teamId = teamId
    this.now = now
    this.jwt = null
    this.issuedAt = 0
    this.minted = 0
  }

  current() {
    if (!this.jwt || this.now() - this.issuedAt >= TOKEN_MAX_AGE_MS) this.mint()
    return this.jwt
  }

  // APNs said ExpiredProviderToken: a new one, unless the one we hold is younger than 20 min.
  expired() {
    if (this.now() - this.issuedAt >= TOKEN_MIN_AGE_MS) this.mint()
  }

  mint() {
    this.issuedAt = this.now()
    const head = b64url(JSON.stringify({ alg: 'ES256', kid: this.keyId }))
    const claims = b64url(JSON.stringify({ iss: this.teamId, iat: Math.floor(this.issuedAt / 1000) }))
    // JOSE wants the raw r||s signature, not DER.
    const signature = sign('sha256', Buffer.from(`${head}.${claims}`), { key: this.key, dsaEncoding: 'ieee-p1363' })
    this.jwt = `${head}.${claims}.${b64url(signature)}`
    this.minted++
  }
}

export function apnsPayload({ org, nid, by, verb }) {
  return { aps: { alert: { title: `New ${verb}`, body: `${by} ${verb}` }, sound: 'default' }, n: { o: org, id: nid } }
}

// What an answer means for the device and the job:
// sent | dead (410 Unregistered, 400 BadDeviceToken) | retry (429, 5xx, transport) | auth (403
// ExpiredProviderToken / InvalidProviderToken: retried with a new token) | rejected (any other 4xx,
// final for this device: sending again would be refused again).
export function apnsOutcome(status, reason, retryAfter) {
  if (status === 200) return { kind: 'sent', status }
  if (status === 410 || (status === 400 && reason === 'BadDeviceToken')) return { kind: 'dead', status, reason }
  if (status === 403 && /ProviderToken/.test(reason || '')) return { kind: 'auth', status, reason }
  if (status === 429 || status >= 500) return { kind: 'retry', status, reason, retryAfterS: retryAfterSeconds(retryAfter) }
  return { kind: 'rejected', status, reason }
}

export class Apns {
  constructor(config) {
    this.url = config.apnsUrl
    this.ca = config.apnsCa ? readFileSync(config.apnsCa) : undefined
    this.topic = config.apnsTopic
    this.token = new ProviderToken(readFileSync(config.apnsKey), config.apnsKeyId, config.apnsTeamId)
    this.session = null
  }

  // One connection, made again after it closes, errs or is sent GOAWAY.
  connection() {
    if (this.session && !this.session.closed && !this.session.destroyed) return this.session
    const session = http2.connect(this.url, { ca: this.ca })
    const forget = () => {
      if (this.session === session) this.session = null
    }
    session.on('error', forget)
    session.on('goaway', forget)
    session.on('close', forget)
    // An idle connection must not keep the process alive at stop.
    session.unref()
    this.session = session
    return session
  }

  send(push) {
    return new Promise((resolve) => {
      let req
      try {
        req = this.connection().request({
          ':method': 'POST',
          ':path': `/3/device/${push.token}`,
          authorization: `bearer ${this.token.current()}`,
          'apns-topic': this.topic,
          'apns-push-type': 'alert',
          'apns-priority': '10',
          'apns-expiration': String(Math.floor(Date.now() / 1000) + 86400),
          // A redelivered push replaces the first on the device instead of showing twice.
          ...(Buffer.byteLength(push.nid) <= 64 ? { 'apns-collapse-id': push.nid } : {}),
          'content-type': 'application/json',
        })
      } catch (err) {
        this.session = null
        return resolve({ kind: 'retry', status: 0, reason: `transport: ${err.message}`, retryAfterS: null })
      }
      let status = 0
      let retryAfter
      const chunks = []
      req.setTimeout(REQUEST_TIMEOUT_MS, () => req.close(http2.constants.NGHTTP2_CANCEL))
      req.on('response', (headers) => {
        status = headers[':status']
        retryAfter = headers['retry-after']
      })
      req.on('data', (c) => chunks.push(c))
      req.on('error', (err) => resolve({ kind: 'retry', status: 0, reason: `transport: ${err.message}`, retryAfterS: null }))
      req.on('close', () => {
        if (!status) return resolve({ kind: 'retry', status: 0, reason: 'transport: no answer', retryAfterS: null })
        let reason
        try {
          reason = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()).reason : undefined
        } catch {
          reason = undefined
        }
        const outcome = apnsOutcome(status, reason, retryAfter)
        if (outcome.kind === 'auth' && reason === 'ExpiredProviderToken') this.token.expired()
        resolve(outcome)
      })
      req.end(JSON.stringify(apnsPayload(push)))
    })
  }

  close() {
    this.session?.close()
  }
}
