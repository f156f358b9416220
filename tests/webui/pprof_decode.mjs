// Decodes a gzipped pprof file with the pprof-format package (an independent decoder) and
// prints what the test compares: sample types, the string table head and folded stacks.
import { readFileSync } from 'node:fs'
import { gunzipSync } from 'node:zlib'
import { Profile } from 'pprof-format'

const profile = Profile.decode(gunzipSync(readFileSync(process.argv[2])))
const strings = profile.stringTable.strings
const functions = new Map(profile.function.map(f => [String(f.id), strings[Number(f.name)]]))
const locations = new Map(profile.location.map(l => [String(l.id), l.line.map(line => ({
  name: functions.get(String(line.functionId)), line: Number(line.line) }))]))
const stacks = {}
for (const sample of profile.sample) {
  const frames = sample.locationId.map(id => {
    const [line] = locations.get(String(id))
    return line.line ? `${line.name}:${line.line}` : line.name
  }).reverse()
  const key = frames.join('\n')
  stacks[key] = (stacks[key] || 0) + Number(sample.value[0])
}
console.log(JSON.stringify({
  sampleTypes: profile.sampleType.map(t => [strings[Number(t.type)], strings[Number(t.unit)]]),
  periodType: [strings[Number(profile.periodType.type)], strings[Number(profile.periodType.unit)]],
  period: Number(profile.period),
  firstString: strings[0],
  functions: profile.function.length,
  locations: profile.location.length,
  stacks,
}))
