// Provider back-pressure: a 429 or 503 with Retry-After pauses every send to that provider
// scope (APNs; FCM per project) until it passes. Every answer is read: a later 429 that says
// "longer" extends the pause, so a pause already running never hides a newer one.

// Retry-After is seconds or an HTTP date; null when absent or unreadable.
export function retryAfterSeconds(value, nowMs = Date.now()) {
  if (value === undefined || value === null || value === '') return null
  const text = String(value).trim()
  if (/^\d+$/.test(text)) return Number(text)
  const at = Date.parse(text)
  return Number.isNaN(at) ? null : Math.max(0, (at - nowMs) / 1000)
}

export class Pauses {
  constructor() {
    this.until = new Map()
  }

  pause(scope, seconds, nowMs = Date.now()) {
    this.until.set(scope, Math.max(this.until.get(scope) || 0, nowMs + seconds * 1000))
  }

  // Milliseconds still to wait before sending to `scope`.
  remaining(scope, nowMs = Date.now()) {
    return Math.max(0, (this.until.get(scope) || 0) - nowMs)
  }
}

// Without a Retry-After: 2, 4, 8 ... seconds by the job's receive count, at most 30.
export const backoffS = (receives) => Math.min(2 ** Math.max(1, receives), 30)
