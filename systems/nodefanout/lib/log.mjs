// One JSON object a line on stderr: what an operator (or a test) greps for, without a
// logging library. Counters say how often each outcome happened since the process started.
let role = 'nodefanout'
export const counts = {}

export function setRole(name) {
  role = name
}

export function count(what, n = 1) {
  counts[what] = (counts[what] || 0) + n
}

function write(level, msg, fields) {
  const line = { at: new Date().toISOString(), role, level, msg, ...fields }
  process.stderr.write(JSON.stringify(line) + '\n')
}

export const info = (msg, fields = {}) => write('info', msg, fields)
export const warn = (msg, fields = {}) => write('warn', msg, fields)
export const error = (msg, fields = {}) => write('error', msg, fields)
