// Quiet hours ("do not disturb") on the member's own wall clock, in their IANA zone, read with
// Intl.DateTimeFormat: no time-zone package, the zone data is the one Node ships with ICU.
// A window [begin, end) may cross midnight; begin == end covers nothing.

const CLOCK = /^([01]\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?$/
const DAY = 86400
const formatters = new Map()

// Seconds since midnight of "HH:MM" or "HH:MM:SS", or null for anything else.
export function parseClock(text) {
  const m = typeof text === 'string' && CLOCK.exec(text)
  return m ? Number(m[1]) * 3600 + Number(m[2]) * 60 + Number(m[3] || 0) : null
}

// Throws RangeError for a zone ICU does not know. Formatters are cached: building one costs far
// more than using it, and a sender asks for the same few zones all day.
function formatter(zone) {
  let f = formatters.get(zone)
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', { timeZone: zone, hourCycle: 'h23', hour: '2-digit', minute: '2-digit', second: '2-digit' })
    formatters.set(zone, f)
  }
  return f
}

export function isKnownZone(zone) {
  try {
    formatter(zone)
    return true
  } catch {
    return false
  }
}

// Seconds since local midnight in `zone` at the instant `ms` (epoch milliseconds).
export function localSeconds(zone, ms) {
  const parts = {}
  for (const p of formatter(zone).formatToParts(new Date(ms))) parts[p.type] = Number(p.value)
  return parts.hour * 3600 + parts.minute * 60 + parts.second
}

function inside(begin, end, t) {
  if (begin === end) return false
  return begin < end ? t >= begin && t < end : t >= begin || t < end
}

// Seconds until the window ends when `ms` is inside it, else null. Throws RangeError for an
// unknown zone (the sender defers: it cannot tell). The wall-clock difference is corrected once
// for a DST change before the end (New York's 01:30 -> 03:00 is 30 minutes on the night the
// clocks spring forward, not 90), and checked: the answer is an instant outside the window.
export function quietRemaining(window, zone, ms) {
  if (!window) return null
  const begin = parseClock(window.begin)
  const end = parseClock(window.end)
  if (begin === null || end === null) return null
  const now = localSeconds(zone, ms)
  if (!inside(begin, end, now)) return null
  const naive = (end - now + DAY) % DAY || DAY
  const then = localSeconds(zone, ms + naive * 1000)
  let shift = (end - then) % DAY
  if (shift > DAY / 2) shift -= DAY
  if (shift < -DAY / 2) shift += DAY
  for (const candidate of [naive + shift, naive]) {
    if (candidate > 0 && !inside(begin, end, localSeconds(zone, ms + candidate * 1000))) return candidate
  }
  return naive
}
