// The pure parts, with Node's own test runner: node --test systems/nodefanout/test/
// (tests/test_nodefanout.py runs this too). No network, no stores.
import assert from 'node:assert/strict'
import { generateKeyPairSync, verify } from 'node:crypto'
import { test } from 'node:test'
import { crc32 } from 'node:zlib'
import { validProfile } from '../lib/api.mjs'
import { apnsOutcome, apnsPayload, ProviderToken } from '../lib/apns.mjs'
import { BadConfig, configFromArgs } from '../lib/config.mjs'
import { consent } from '../lib/consent.mjs'
import { dedupKey } from '../lib/dedup.mjs'
import { fcmOutcome, fcmRequest, projectFor } from '../lib/fcm.mjs'
import { jobBody, Malformed, parseJob } from '../lib/job.mjs'
import { localSeconds, quietRemaining } from '../lib/quiet-hours.mjs'
import { backoffS, Pauses, retryAfterSeconds } from '../lib/retry-after.mjs'
import { isUlid, mintUlid } from '../lib/ulid.mjs'

const at = (iso) => Date.parse(iso)

test('minted ids are ULIDs, in time order, and the check refuses anything else', () => {
  const a = mintUlid(at('2026-03-10T12:00:00Z'))
  const b = mintUlid(at('2026-03-10T12:00:01Z'))
  assert.ok(isUlid(a) && isUlid(b) && a < b)
  assert.equal(mintUlid(0).slice(0, 10), '0000000000')
  for (const bad of ['', 'malformed-' + '0'.repeat(16), a.toLowerCase(), a + 'A', '8' + a.slice(1), a.slice(0, 25) + 'U', 42, null]) {
    assert.equal(isUlid(bad), false, String(bad))
  }
})

test('quiet hours are read on the member\'s own wall clock, across midnight and DST', () => {
  const night = { begin: '22:00', end: '07:00' }
  // 17:15 UTC is 23:00 in Kathmandu (UTC+05:45): inside, 8 hours before the end.
  const t = at('2026-03-10T17:15:00Z')
  assert.equal(localSeconds('Asia/Kathmandu', t), 23 * 3600)
  assert.equal(quietRemaining(night, 'Asia/Kathmandu', t), 8 * 3600)
  assert.equal(quietRemaining(night, 'UTC', t), null)
  assert.equal(quietRemaining({ begin: '07:00', end: '07:00' }, 'Asia/Kathmandu', t), null)
  assert.equal(quietRemaining({ begin: '23:00', end: '23:00:30' }, 'Asia/Kathmandu', t), 30)
  assert.equal(quietRemaining(null, 'UTC', t), null)
  // New York springs forward on 2026-03-08: from 01:30 to 03:00 local is 30 minutes.
  assert.equal(quietRemaining({ begin: '22:00', end: '03:00' }, 'America/New_York', at('2026-03-08T06:30:00Z')), 1800)
  assert.throws(() => quietRemaining(night, 'Mars/Olympus', t), RangeError)
})

test('consent is default deny; the bug allows only the missing record', () => {
  const optIn = { at: '2026-01-01T00:00:00Z', version: '1', revokedAt: null }
  const yes = { tz: 'UTC', optIn, pushEnabled: true }
  assert.equal(consent(yes).ok, true)
  for (const p of [null, { ...yes, optIn: null }, { ...yes, optIn: { ...optIn, revokedAt: '2026-02-01T00:00:00Z' } }, { ...yes, pushEnabled: false }]) {
    assert.equal(consent(p).ok, false)
  }
  assert.equal(consent({ ...yes, optIn: null }, { defaultAllow: true }).ok, true)
  assert.equal(consent(null, { defaultAllow: true }).ok, true)
  assert.equal(consent({ ...yes, optIn: { ...optIn, revokedAt: '2026-02-01T00:00:00Z' } }, { defaultAllow: true }).ok, false)
})

test('jobs are nested, one per recipient; a malformed one or a bad id is refused', () => {
  const nid = mintUlid()
  const job = { org: 'o1', nid, to: 'u1', by: 'a1', verb: 'post', ref: 'x' }
  assert.deepEqual(parseJob(jobBody(job)), job)
  assert.deepEqual(JSON.parse(jobBody(job)), { v: 1, job })
  const bad = jobBody({ ...job, nid: 'malformed-1234' })
  assert.throws(() => parseJob(bad), Malformed)
  assert.equal(parseJob(bad, { checkId: false }).nid, 'malformed-1234')
  for (const text of ['nope', '{}', '{"v":2,"job":{}}', JSON.stringify({ v: 1, job: { ...job, to: 'a/b' } }), JSON.stringify({ v: 1, job: { ...job, verb: '' } })]) {
    assert.throws(() => parseJob(text, { checkId: false }), Malformed, text)
  }
  assert.equal(dedupKey('o1', nid, 'tok'), `np:sent:o1:${nid}:tok`)
})

test('a member keeps one FCM project, crc32 of their id; the bug moves them per message', () => {
  const projects = ['np-0', 'np-1']
  for (const member of ['u000001', 'alice', 'émile']) {
    const expected = projects[crc32(Buffer.from(member, 'utf8')) % 2]
    for (let i = 0; i < 5; i++) assert.equal(projectFor(member, mintUlid(), projects), expected)
  }
  const seen = new Set()
  for (let i = 0; i < 40; i++) seen.add(projectFor('alice', mintUlid(), projects, { unstable: true }))
  assert.equal(seen.size, 2)
})

test('provider answers are classified, and Retry-After is read', () => {
  assert.equal(apnsOutcome(200).kind, 'sent')
  assert.equal(apnsOutcome(410, 'Unregistered').kind, 'dead')
  assert.equal(apnsOutcome(400, 'BadDeviceToken').kind, 'dead')
  assert.equal(apnsOutcome(400, 'BadCollapseId').kind, 'rejected')
  assert.equal(apnsOutcome(403, 'ExpiredProviderToken').kind, 'auth')
  assert.deepEqual(apnsOutcome(429, 'TooManyRequests', '3'), { kind: 'retry', status: 429, reason: 'TooManyRequests', retryAfterS: 3 })
  const unregistered = { error: { code: 404, status: 'NOT_FOUND', details: [{ errorCode: 'UNREGISTERED' }] } }
  assert.equal(fcmOutcome(404, unregistered).kind, 'dead')
  assert.equal(fcmOutcome(503, {}, 'Tue, 10 Mar 2026 12:00:05 GMT').kind, 'retry')
  assert.equal(fcmOutcome(400, { error: { status: 'INVALID_ARGUMENT' } }).kind, 'rejected')
  assert.equal(retryAfterSeconds('Tue, 10 Mar 2026 12:00:05 GMT', at('2026-03-10T12:00:00Z')), 5)
  assert.equal(retryAfterSeconds('soon'), null)
  assert.deepEqual([1, 2, 3, 9].map(backoffS), [2, 4, 8, 30])
  const pauses = new Pauses()
  pauses.pause('apns', 3, 1000)
  pauses.pause('apns', 1, 1500) // a shorter one later does not shorten the pause
  assert.equal(pauses.remaining('apns', 2000), 2000)
  pauses.pause('apns', 5, 2000) // a longer one extends it
  assert.equal(pauses.remaining('apns', 2000), 5000)
  assert.equal(pauses.remaining('fcm:np-0', 2000), 0)
})

test('payloads carry the ids at nodefanout\'s own keys', () => {
  const push = { token: 't', org: 'o1', nid: 'N', by: 'a', verb: 'post' }
  assert.deepEqual(apnsPayload(push).n, { o: 'o1', id: 'N' })
  assert.equal(apnsPayload(push).tenant_id, undefined)
  assert.deepEqual(fcmRequest(push).message.data, { o: 'o1', nid: 'N' })
})

test('the APNs provider token is an ES256 JWT, reused for 50 minutes, renewed no sooner than 20', () => {
  const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' })
  let now = at('2026-03-10T12:00:00Z')
  const token = new ProviderToken(privateKey.export({ type: 'pkcs8', format: 'pem' }), 'KEY1234567', 'TEAM123456', () => now)
  const jwt = token.current()
  const [head, claims, signature] = jwt.split('.')
  assert.deepEqual(JSON.parse(Buffer.from(head, 'base64url')), { alg: 'ES256', kid: 'KEY1234567' })
  assert.deepEqual(JSON.parse(Buffer.from(claims, 'base64url')), { iss: 'TEAM123456', iat: now / 1000 })
  const ok = verify('sha256', Buffer.from(`${head}.${claims}`), { key: publicKey, dsaEncoding: 'ieee-p1363' }, Buffer.from(signature, 'base64url'))
  assert.ok(ok)
  now += 10 * 60 * 1000
  token.expired() // APNs said expired 10 minutes in: too soon to mint again
  assert.equal(token.current(), jwt)
  now += 39 * 60 * 1000
  assert.equal(token.current(), jwt)
  now += 60 * 1000 // 50 minutes
  assert.notEqual(token.current(), jwt)
  assert.equal(token.minted, 2)
})

test('profiles are validated whole', () => {
  const good = { tz: 'Asia/Kathmandu', doNotDisturb: { begin: '22:00:00', end: '07:00:30' }, optIn: { at: '2026-01-01T00:00:00+00:00', version: '1' }, pushEnabled: true }
  assert.deepEqual(validProfile(good).optIn, { at: good.optIn.at, version: '1', revokedAt: null })
  assert.deepEqual(validProfile({}), { tz: 'UTC', doNotDisturb: null, optIn: null, pushEnabled: true })
  for (const bad of [{ tz: 'Mars/Olympus' }, { doNotDisturb: { begin: '25:00', end: '07:00' } }, { optIn: { at: 'yesterday', version: '1' } }, { pushEnabled: 'yes' }, { zone: 'UTC' }]) {
    assert.throws(() => validProfile(bad), (err) => err.status === 400, JSON.stringify(bad))
  }
})

test('the command line refuses what it cannot use', () => {
  assert.throws(() => configFromArgs('api', []), /--port is required/)
  assert.throws(() => configFromArgs('api', ['--port', '1', '--host', '0.0.0.0']), /loopback/)
  assert.throws(() => configFromArgs('api', ['--port', '1', '--bugs', 'telepathy']), BadConfig)
  assert.throws(() => configFromArgs('worker', []), /role/)
  assert.deepEqual([...configFromArgs('router', [], { NODEFANOUT_BUGS: 'no_id_check' }).bugs], ['no_id_check'])
  assert.throws(() => configFromArgs('sender', ['--dedup-redis', 'http://x']), /redis/)
})
