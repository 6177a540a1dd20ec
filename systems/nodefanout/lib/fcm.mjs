// FCM HTTP v1: POST {fcm-url}/v1/projects/{project}/messages:send with an OAuth2 access token
// from the service account's token_uri (JWT-bearer grant, RS256 assertion signed with
// node:crypto), cached until a minute before it expires. Two sender projects; a member stays on
// one, chosen by crc32 of their id, so their devices' registrations never move between projects.
import { createPrivateKey, sign } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { crc32 } from 'node:zlib'
import { retryAfterSeconds } from './retry-after.mjs'

const SCOPE = 'https://www.googleapis.com/auth/firebase.messaging'
const JWT_BEARER = 'urn:ietf:params:oauth:grant-type:jwt-bearer'
const REQUEST_TIMEOUT_MS = 10000
const b64url = (data) => Buffer.from(data).toString('base64url')

export class AccessTokens {
  constructor(credentialsPath, now = () => Date.now()) {
    const info = JSON.parse(readFileSync(credentialsPath, 'utf8'))
    for (const field of ['client_email', 'private_key', 'token_uri']) {
      if (!info[field]) throw new Error(`${credentialsPath}: no ${field} (a service-account key file?)`)
    }
    this.info = info
    this.key = createPrivateKey(info.private_key)
    this.now = now
    this.token = null
    this.expiresAt = 0
    this.inflight = null
    this.fetched = 0
  }

  assertion() {
    const iat = Math.floor(this.now() / 1000)
    const head = b64url(JSON.stringify({ alg: 'RS256', typ: 'JWT', kid: this.info.private_key_id }))
    const claims = b64url(JSON.stringify({ iss: this.info.client_email, scope: SCOPE, aud: this.info.token_uri, iat, exp: iat + 3600 }))
    const signature = sign('RSA-SHA256', Buffer.from(`${head}.${claims}`), this.key)
    return `${head}.${claims}.${b64url(signature)}`
  }

  // One fetch at a time: a burst of sends at start must not ask for a token each.
  async current() {
    if (this.token && this.now() < this.expiresAt - 60000) return this.token
    this.inflight ||= this.fetch().finally(() => {
      this.inflight = null
    })
    return this.inflight
  }

  // FCM answered 401: the cached token is no good, whatever its expiry said.
  forget() {
    this.token = null
  }

  async fetch() {
    const response = await fetch(this.info.token_uri, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ grant_type: JWT_BEARER, assertion: this.assertion() }),
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    })
    const body = await response.json().catch(() => ({}))
    if (!response.ok || !body.access_token) throw new Error(`token endpoint answered ${response.status} ${body.error || ''}`)
    this.token = body.access_token
    this.expiresAt = this.now() + Number(body.expires_in || 3600) * 1000
    this.fetched++
    return this.token
  }
}

// A member's project: crc32 of the UTF-8 of their id, mod the number of projects. The
// unstable_fcm_project bug hashes the notification id instead: the same member lands on
// either project from one push to the next.
export function projectFor(member, nid, projects, { unstable = false } = {}) {
  const key = unstable ? nid : member
  return projects[crc32(Buffer.from(key, 'utf8')) % projects.length]
}

export function fcmRequest({ token, org, nid, by, verb }) {
  return {
    message: {
      token,
      notification: { title: `New ${verb}`, body: `${by} ${verb}` },
      data: { o: org, nid },
      android: { collapse_key: nid, ttl: '86400s' },
    },
  }
}

// sent | dead (404 UNREGISTERED) | retry (429, 5xx, transport) | auth (401: a new token) |
// rejected (any other 4xx: sending again would be refused again).
export function fcmOutcome(status, body, retryAfter) {
  if (status === 200) return { kind: 'sent', status }
  const details = body?.error?.details || []
  const code = details.map((d) => d.errorCode).find(Boolean) || body?.error?.status
  if (status === 404 && code === 'UNREGISTERED') return { kind: 'dead', status, reason: code }
  if (status === 401) return { kind: 'auth', status, reason: code }
  if (status === 429 || status >= 500) return { kind: 'retry', status, reason: code, retryAfterS: retryAfterSeconds(retryAfter) }
  return { kind: 'rejected', status, reason: code }
}

export class Fcm {
  constructor(config) {
    this.url = config.fcmUrl
    this.tokens = new AccessTokens(config.fcmCredentials)
  }

  async send(project, push) {
    let access
    try {
      access = await this.tokens.current()
    } catch (err) {
      return { kind: 'retry', status: 0, reason: `oauth: ${err.message}`, retryAfterS: null }
    }
    let response
    try {
      response = await fetch(`${this.url}/v1/projects/${encodeURIComponent(project)}/messages:send`, {
        method: 'POST',
        headers: { authorization: `Bearer ${access}`, 'content-type': 'application/json' },
        body: JSON.stringify(fcmRequest(push)),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      })
    } catch (err) {
      return { kind: 'retry', status: 0, reason: `transport: ${err.cause?.code || err.message}`, retryAfterS: null }
    }
    const body = await response.json().catch(() => null)
    const outcome = fcmOutcome(response.status, body, response.headers.get('retry-after'))
    if (outcome.kind === 'auth') this.tokens.forget()
    return outcome
  }
}
