// Notification ids are ULIDs: 26 characters of Crockford's base32, a 48-bit millisecond time
// then 80 random bits, so ids sort by when they were minted. Minted here rather than with a
// package: twenty lines, and the check below is what guards the providers.
import { randomBytes } from 'node:crypto'

const ALPHABET = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
// The first character carries only 3 bits (48 + 80 = 128 = 26 * 5 - 2).
const SHAPE = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/

export function isUlid(value) {
  return typeof value === 'string' && SHAPE.test(value)
}

export function mintUlid(now = Date.now()) {
  let time = ''
  let t = now
  for (let i = 0; i < 10; i++) {
    time = ALPHABET[t % 32] + time
    t = Math.floor(t / 32)
  }
  // 80 bits as 16 characters of 5 bits, read from 10 random bytes.
  const bytes = randomBytes(10)
  let bits = 0n
  for (const b of bytes) bits = (bits << 8n) | BigInt(b)
  let random = ''
  for (let i = 0; i < 16; i++) {
    random = ALPHABET[Number(bits & 31n)] + random
    bits >>= 5n
  }
  return time + random
}
