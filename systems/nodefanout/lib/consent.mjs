// Whether a member agreed to pushes. Default deny: no profile, no opt-in on record, an opt-in
// revoked, or push switched off all mean nothing is sent.
// defaultAllow is the consent_default_allow bug: a member with no opt-in on record gets pushes
// (a revoked one or push switched off still stops them: the bug is about the default only).
export function consent(profile, { defaultAllow = false } = {}) {
  if (!profile) return defaultAllow ? { ok: true, why: 'no profile (allowed by default)' } : { ok: false, why: 'no profile' }
  if (profile.pushEnabled === false) return { ok: false, why: 'push switched off' }
  const optIn = profile.optIn
  if (!optIn) return defaultAllow ? { ok: true, why: 'no opt-in (allowed by default)' } : { ok: false, why: 'no opt-in' }
  if (optIn.revokedAt) return { ok: false, why: 'opt-in revoked' }
  return { ok: true, why: `opted in (version ${optIn.version})` }
}
