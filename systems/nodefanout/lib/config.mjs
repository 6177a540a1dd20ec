// The command line of each role and the configuration it yields. Every bad value is refused
// with a sentence and exit 2 before anything connects: a typo in a game-day command line should
// not look like an outage of the system.
import { existsSync } from 'node:fs'
import { parseArgs } from 'node:util'

// The deliberate bugs, each a realistic one-line mistake, off unless --bugs or NODEFANOUT_BUGS
// names it. The tests show each one changing what reaches the providers.
export const BUGS = {
  dedup_fail_open: 'a dedup-store error or timeout sends anyway instead of leaving the job',
  dedup_short_ttl: "a 'sent' mark lives an hour (PX 3600000), not 30 days",
  claim_before_send: "the 30-day 'sent' mark is taken before the push leaves, not a lease: a sender killed mid-send leaves the mark, and the push is never sent",
  no_id_check: 'a job whose notification id is no ULID is sent, not quarantined',
  quiet_hours_utc: "quiet hours are read on the UTC clock, not the member's zone",
  retry_after_ignored: 'a 429/503 Retry-After does not pause that provider',
  unstable_fcm_project: "the FCM project is picked per message (crc32 of the notification id), not per member",
  consent_default_allow: 'a member with no opt-in on record gets pushes',
}

export const ROLES = ['api', 'router', 'sender']

export class BadConfig extends Error {}

const COMMON = {
  'sqs-endpoint': { type: 'string' },
  'dynamodb-endpoint': { type: 'string' },
  region: { type: 'string', default: 'us-east-1' },
  prefix: { type: 'string', default: 'np' },
  'pid-file': { type: 'string' },
  bugs: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
}

const BY_ROLE = {
  api: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string' },
  },
  router: {
    // Fan-out of one broadcast: SendMessageBatch calls in flight at once.
    'batch-concurrency': { type: 'string', default: '8' },
  },
  sender: {
    'dedup-redis': { type: 'string' },
    'apns-url': { type: 'string' },
    'apns-ca': { type: 'string' },
    'apns-key': { type: 'string' },
    'apns-key-id': { type: 'string' },
    'apns-team-id': { type: 'string' },
    'apns-topic': { type: 'string', default: 'com.example.nodefanout' },
    'fcm-url': { type: 'string' },
    'fcm-credentials': { type: 'string' },
    'fcm-projects': { type: 'string', default: 'np-0,np-1' },
    // Receive loops, each holding up to 10 jobs.
    loops: { type: 'string', default: '4' },
    'visibility-timeout': { type: 'string', default: '30' },
    // How long a claim holds a device before the push is marked sent; longer than a send takes.
    'dedup-lease': { type: 'string', default: '30' },
  },
}

export function usage(role) {
  const options = { ...COMMON, ...(BY_ROLE[role] || {}) }
  const lines = Object.entries(options).map(
    ([name, o]) => `  --${name}${o.type === 'string' ? ' VALUE' : ''}${o.default ? ` (default ${o.default})` : ''}`,
  )
  return `usage: node systems/nodefanout/nodefanout.mjs ${role || '{api|router|sender}'} [options]\n${lines.join('\n')}\nbugs: ${Object.keys(BUGS).join(', ')}`
}

function url(value, option, schemes) {
  let parsed
  try {
    parsed = new URL(value)
  } catch {
    throw new BadConfig(`--${option}: not a URL: ${JSON.stringify(value)}`)
  }
  if (!schemes.includes(parsed.protocol.replace(':', '')) || !parsed.hostname) {
    throw new BadConfig(`--${option}: expected a ${schemes.join('/')} URL, got ${JSON.stringify(value)}`)
  }
  return value.replace(/\/+$/, '')
}

function int(value, option, low, high) {
  const n = Number(value)
  if (!Number.isInteger(n) || n < low || n > high) {
    throw new BadConfig(`--${option}: a whole number from ${low} to ${high}, got ${JSON.stringify(value)}`)
  }
  return n
}

function file(value, option) {
  if (!value) throw new BadConfig(`--${option} is required`)
  if (!existsSync(value)) throw new BadConfig(`--${option}: no such file ${value}`)
  return value
}

export function parseBugs(text) {
  const names = (text || '').split(',').map((s) => s.trim()).filter(Boolean)
  const unknown = names.filter((n) => !(n in BUGS))
  if (unknown.length) {
    throw new BadConfig(`--bugs: unknown ${unknown.join(', ')}; known: ${Object.keys(BUGS).join(', ')}`)
  }
  return new Set(names)
}

// argv: what follows the role. env: NODEFANOUT_BUGS when --bugs is not given.
export function configFromArgs(role, argv, env = process.env) {
  if (!ROLES.includes(role)) throw new BadConfig(`the first argument is the role: ${ROLES.join(', ')}; got ${JSON.stringify(role)}`)
  let values
  try {
    ;({ values } = parseArgs({ args: argv, options: { ...COMMON, ...BY_ROLE[role] }, strict: true, allowPositionals: false }))
  } catch (err) {
    throw new BadConfig(err.message)
  }
  if (values.help) return { role, help: true }
  const prefix = values.prefix
  // SQS names: 80 characters; the longest of ours is <prefix>-quarantine.
  if (!/^[A-Za-z0-9_-]{1,60}$/.test(prefix)) throw new BadConfig(`--prefix: 1 to 60 of A-Z a-z 0-9 _ -, got ${JSON.stringify(prefix)}`)
  const config = {
    role,
    region: values.region,
    sqsEndpoint: values['sqs-endpoint'] ? url(values['sqs-endpoint'], 'sqs-endpoint', ['http', 'https']) : undefined,
    dynamodbEndpoint: values['dynamodb-endpoint'] ? url(values['dynamodb-endpoint'], 'dynamodb-endpoint', ['http', 'https']) : undefined,
    prefix,
    pidFile: values['pid-file'],
    bugs: parseBugs(values.bugs ?? env.NODEFANOUT_BUGS),
  }
  if (role === 'api') {
    if (values.port === undefined) throw new BadConfig('--port is required')
    config.port = int(values.port, 'port', 1, 65535)
    if (!['127.0.0.1', 'localhost', '::1'].includes(values.host)) {
      throw new BadConfig(`--host: the API listens on loopback only, not ${JSON.stringify(values.host)}`)
    }
    config.host = values.host
  }
  if (role === 'router') config.batchConcurrency = int(values['batch-concurrency'], 'batch-concurrency', 1, 64)
  if (role === 'sender') {
    if (!values['dedup-redis']) throw new BadConfig('--dedup-redis is required')
    config.dedupRedis = url(values['dedup-redis'], 'dedup-redis', ['redis'])
    if (!values['apns-url']) throw new BadConfig('--apns-url is required')
    config.apnsUrl = url(values['apns-url'], 'apns-url', ['http', 'https'])
    config.apnsCa = values['apns-ca'] ? file(values['apns-ca'], 'apns-ca') : undefined
    config.apnsKey = file(values['apns-key'], 'apns-key')
    for (const option of ['apns-key-id', 'apns-team-id']) {
      if (!/^[A-Z0-9]{10}$/.test(values[option] || '')) throw new BadConfig(`--${option}: ten characters A-Z 0-9, as Apple issues them`)
    }
    config.apnsKeyId = values['apns-key-id']
    config.apnsTeamId = values['apns-team-id']
    config.apnsTopic = values['apns-topic']
    if (!values['fcm-url']) throw new BadConfig('--fcm-url is required')
    config.fcmUrl = url(values['fcm-url'], 'fcm-url', ['http', 'https'])
    config.fcmCredentials = file(values['fcm-credentials'], 'fcm-credentials')
    config.fcmProjects = values['fcm-projects'].split(',').map((s) => s.trim()).filter(Boolean)
    if (!config.fcmProjects.length) throw new BadConfig('--fcm-projects: at least one project')
    config.loops = int(values.loops, 'loops', 1, 64)
    config.visibilityTimeout = int(values['visibility-timeout'], 'visibility-timeout', 5, 43200)
    config.dedupLeaseMs = int(values['dedup-lease'], 'dedup-lease', 1, 600) * 1000
  }
  return config
}

export const queueNames = (prefix) => ({
  events: `${prefix}-events`,
  jobs: `${prefix}-jobs`,
  dead: `${prefix}-jobs-dead`,
  quarantine: `${prefix}-quarantine`,
})

export const tableNames = (prefix) => ({
  members: `${prefix}-members`,
  devices: `${prefix}-devices`,
  audience: `${prefix}-audience`,
})
