// Runs webui/static/js/frames.js over the hostile frame names and prints what it makes of
// each, for tests/profile/test_profile_frames.py to compare with the Python side. The module
// is loaded from its text as a data: URL: it imports nothing, and Node then reads it as the
// ES module the browser loads, whatever the package's type.
import { readFileSync } from 'node:fs'

const [modulePath, fixturePath] = process.argv.slice(2)
const source = readFileSync(modulePath, 'utf8')
const frames = await import('data:text/javascript;base64,' + Buffer.from(source).toString('base64'))
const { frames: cases } = JSON.parse(readFileSync(fixturePath, 'utf8'))
const names = cases.map(c => c.name)
console.log(JSON.stringify({
  escaped: names.map(frames.escapeFrame),
  unescaped: cases.map(c => frames.unescapeFrame(c.escaped)),
  folded: frames.foldedStack(names),
  display: frames.displayFrames(frames.foldedStack(names)),
  shown: names.map(frames.shownName)
}))
