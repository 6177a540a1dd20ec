// The messages between the roles, in nodefanout's own nested schema (a team's, not the
// reference's flat one):
//   event (API -> router):  {"v":1,"event":{"org","nid","by","verb","ref","at"}}
//   job (router -> sender): {"v":1,"job":{"org","nid","to","by","verb","ref"}}
// one job per RECIPIENT: the sender finds the recipient's devices when it sends.
import { isUlid } from './ulid.mjs'

// Org and member ids: no "/" (the store joins org/member with one) and nothing a URL path or a
// Redis key pattern would read differently.
export const ID = /^[A-Za-z0-9._~@+-][A-Za-z0-9._~:@+-]{0,127}$/

export class Malformed extends Error {}

export const eventBody = (event) => JSON.stringify({ v: 1, event })

export const jobBody = ({ org, nid, to, by, verb, ref }) => JSON.stringify({ v: 1, job: { org, nid, to, by, verb, ref } })

function envelope(text, name) {
  let doc
  try {
    doc = JSON.parse(text)
  } catch {
    throw new Malformed('not JSON')
  }
  if (!doc || typeof doc !== 'object' || doc.v !== 1) throw new Malformed('not a version 1 message')
  const inner = doc[name]
  if (!inner || typeof inner !== 'object' || Array.isArray(inner)) throw new Malformed(`no ${name} object`)
  return inner
}

function ids(inner, names) {
  for (const name of names) {
    if (typeof inner[name] !== 'string' || !ID.test(inner[name])) throw new Malformed(`${name} is not an id`)
  }
}

// checkId false is the no_id_check bug: any non-empty string passes as a notification id.
function nidOf(inner, checkId) {
  const nid = inner.nid
  if (checkId ? !isUlid(nid) : typeof nid !== 'string' || !nid) throw new Malformed(`nid ${JSON.stringify(nid)} is not a ULID`)
  return nid
}

export function parseJob(text, { checkId = true } = {}) {
  const job = envelope(text, 'job')
  ids(job, ['org', 'to', 'by'])
  const nid = nidOf(job, checkId)
  if (typeof job.verb !== 'string' || !job.verb) throw new Malformed('no verb')
  return { org: job.org, nid, to: job.to, by: job.by, verb: job.verb, ref: typeof job.ref === 'string' ? job.ref : undefined }
}

export function parseEvent(text) {
  const event = envelope(text, 'event')
  ids(event, ['org', 'by'])
  const nid = nidOf(event, true)
  if (typeof event.verb !== 'string' || !event.verb) throw new Malformed('no verb')
  return { org: event.org, nid, by: event.by, verb: event.verb, ref: event.ref }
}
