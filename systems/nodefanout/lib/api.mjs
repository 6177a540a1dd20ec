// The HTTP API (node:http), nodefanout's own paths and JSON:
//   POST   /v2/orgs/{org}/broadcasts                     {by, verb, ref?, key?} -> 202 {ticket}
//   PUT    /v2/orgs/{org}/members/{id}                   a profile -> 200 {member, profile}
//   GET    /v2/orgs/{org}/members/{id}                   -> {member, profile, devices}
//   DELETE /v2/orgs/{org}/members/{id}                   -> 501: erasure is not offered
//   PUT    /v2/orgs/{org}/members/{id}/devices/{token}   {kind: apple|google} -> 200
//   POST   /v2/orgs/{org}/members/{id}/audience          {add: [member ids]} -> 200 {added}
//   GET    /v2/health
// A broadcast is accepted once it is on the events queue; the router fans it out.
// Every refusal is JSON {error}: 400 bad input, 404, 405, 413, 501, 503 (a store is down).
import http from 'node:http'
import { eventBody, ID } from './job.mjs'
import { isKnownZone, parseClock } from './quiet-hours.mjs'
import { isUlid, mintUlid } from './ulid.mjs'

const MAX_BODY = 1 << 20
export const MAX_AUDIENCE_ADD = 10000
const KINDS = ['apple', 'google']
const TOKEN = /^[A-Za-z0-9_:.-]{1,4096}$/

class Refused extends Error {
  constructor(status, message) {
    super(message)
    this.status = status
  }
}

const bad = (message) => new Refused(400, message)

function only(body, allowed, what) {
  if (!body || typeof body !== 'object' || Array.isArray(body)) throw bad(`${what}: a JSON object`)
  const extra = Object.keys(body).filter((k) => !allowed.includes(k))
  if (extra.length) throw bad(`${what}: unknown field(s) ${extra.join(', ')}; known: ${allowed.join(', ')}`)
}

const isTime = (v) => typeof v === 'string' && !Number.isNaN(Date.parse(v))

// The profile: {tz, doNotDisturb: {begin, end} | null, optIn: {at, version, revokedAt?} | null,
// pushEnabled}. Refused whole when any part is wrong, so nothing half-valid is stored.
export function validProfile(body) {
  only(body, ['tz', 'doNotDisturb', 'optIn', 'pushEnabled'], 'profile')
  const tz = body.tz ?? 'UTC'
  if (typeof tz !== 'string' || !isKnownZone(tz)) throw bad(`tz: not an IANA time zone: ${JSON.stringify(tz)}`)
  let doNotDisturb = body.doNotDisturb ?? null
  if (doNotDisturb !== null) {
    only(doNotDisturb, ['begin', 'end'], 'doNotDisturb')
    for (const edge of ['begin', 'end']) {
      if (parseClock(doNotDisturb[edge]) === null) throw bad(`doNotDisturb.${edge}: HH:MM or HH:MM:SS, got ${JSON.stringify(doNotDisturb[edge])}`)
    }
    doNotDisturb = { begin: doNotDisturb.begin, end: doNotDisturb.end }
  }
  let optIn = body.optIn ?? null
  if (optIn !== null) {
    only(optIn, ['at', 'version', 'revokedAt'], 'optIn')
    if (!isTime(optIn.at)) throw bad('optIn.at: an ISO 8601 time')
    if (typeof optIn.version !== 'string' || !optIn.version) throw bad('optIn.version: a non-empty string')
    if (optIn.revokedAt != null && !isTime(optIn.revokedAt)) throw bad('optIn.revokedAt: an ISO 8601 time or null')
    optIn = { at: optIn.at, version: optIn.version, revokedAt: optIn.revokedAt ?? null }
  }
  const pushEnabled = body.pushEnabled ?? true
  if (typeof pushEnabled !== 'boolean') throw bad('pushEnabled: true or false')
  return { tz, doNotDisturb, optIn, pushEnabled }
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = []
    let size = 0
    req.on('data', (chunk) => {
      size += chunk.length
      if (size > MAX_BODY) {
        reject(new Refused(413, `body over ${MAX_BODY} bytes`))
        req.resume()
        return
      }
      chunks.push(chunk)
    })
    req.on('end', () => {
      if (size > MAX_BODY) return
      if (!size) return resolve(undefined)
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')))
      } catch {
        reject(bad('the body is not JSON'))
      }
    })
    req.on('error', reject)
  })
}

function segments(pathname) {
  try {
    return pathname.split('/').slice(1).map(decodeURIComponent)
  } catch {
    throw bad('a path segment is not valid percent-encoding')
  }
}

function id(value, what) {
  if (!ID.test(value)) throw bad(`${what}: 1 to 128 of A-Z a-z 0-9 . _ ~ : @ + - (no /), got ${JSON.stringify(value)}`)
  return value
}

export function makeApi({ store, queues }) {
  // [method, pattern of segments, handler]; ':x' captures.
  const routes = [
    ['GET', ['v2', 'health'], async () => [200, { ok: true }]],
    [
      'POST',
      ['v2', 'orgs', ':org', 'broadcasts'],
      async ({ org }, body) => {
        only(body, ['by', 'verb', 'ref', 'key'], 'broadcast')
        id(body.by, 'by')
        if (typeof body.verb !== 'string' || !/^[A-Za-z0-9_.-]{1,64}$/.test(body.verb)) throw bad('verb: 1 to 64 of A-Z a-z 0-9 _ . -')
        if (body.ref !== undefined && (typeof body.ref !== 'string' || body.ref.length > 256)) throw bad('ref: a string of at most 256 characters')
        if (body.key !== undefined && !isUlid(body.key)) throw bad(`key: a ULID (26 Crockford base32 characters), got ${JSON.stringify(body.key)}`)
        const nid = body.key ?? mintUlid()
        await queues.send('events', eventBody({ org, nid, by: body.by, verb: body.verb, ref: body.ref, at: new Date().toISOString() }))
        return [202, { ticket: nid }]
      },
    ],
    [
      'PUT',
      ['v2', 'orgs', ':org', 'members', ':member'],
      async ({ org, member }, body) => {
        const profile = validProfile(body)
        await store.putProfile(org, member, profile)
        return [200, { member, profile }]
      },
    ],
    [
      'GET',
      ['v2', 'orgs', ':org', 'members', ':member'],
      async ({ org, member }) => {
        const [profile, devices] = await Promise.all([store.profile(org, member), store.devices(org, member)])
        if (!profile && !devices.length) throw new Refused(404, `no member ${member} in ${org}`)
        return [200, { member, profile, devices }]
      },
    ],
    // Erasure is not offered: a team that erases through another system says so here.
    ['DELETE', ['v2', 'orgs', ':org', 'members', ':member'], async () => [501, { error: 'erasure is not supported by nodefanout' }]],
    [
      'PUT',
      ['v2', 'orgs', ':org', 'members', ':member', 'devices', ':token'],
      async ({ org, member, token }, body) => {
        only(body, ['kind'], 'device')
        if (!KINDS.includes(body.kind)) throw bad(`kind: one of ${KINDS.join(', ')}`)
        if (!TOKEN.test(token)) throw bad('token: 1 to 4096 of A-Z a-z 0-9 _ : . -')
        await store.putDevice(org, member, token, body.kind)
        return [200, { token, kind: body.kind, state: 'live' }]
      },
    ],
    [
      'POST',
      ['v2', 'orgs', ':org', 'members', ':member', 'audience'],
      async ({ org, member }, body) => {
        only(body, ['add'], 'audience')
        const add = body.add
        if (!Array.isArray(add) || !add.length || add.length > MAX_AUDIENCE_ADD) throw bad(`add: 1 to ${MAX_AUDIENCE_ADD} member ids`)
        add.forEach((m) => id(m, 'add[]'))
        const unique = [...new Set(add)]
        await store.addAudience(org, member, unique)
        return [200, { added: unique.length }]
      },
    ],
  ]

  async function route(req) {
    const parts = segments(new URL(req.url, 'http://x').pathname)
    let pathMatched = false
    for (const [method, pattern, handler] of routes) {
      if (pattern.length !== parts.length) continue
      const params = {}
      if (!pattern.every((p, i) => (p.startsWith(':') ? ((params[p.slice(1)] = parts[i]), true) : p === parts[i]))) continue
      pathMatched = true
      if (method !== req.method) continue
      if (params.org !== undefined) id(params.org, 'org')
      if (params.member !== undefined) id(params.member, 'member')
      const body = await readBody(req)
      return handler(params, body)
    }
    throw pathMatched ? new Refused(405, `${req.method} not allowed here`) : new Refused(404, `no such path ${req.url}`)
  }

  return http.createServer(async (req, res) => {
    let status, body
    try {
      ;[status, body] = await route(req)
    } catch (err) {
      if (err instanceof Refused) [status, body] = [err.status, { error: err.message }]
      else [status, body] = [503, { error: `a store is unavailable: ${err.name}: ${err.message}` }]
    }
    const text = JSON.stringify(body)
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) })
    res.end(text)
  })
}
