// Frame names as the wire format escapes them: the twin of sampler/profile/frames.py, tested
// against the same hostile names (tests/data/hostile_frames.json). No DOM here, so Node runs
// it in the tests as it is.

// The separator, the escape character, the two characters JSON escapes, control characters.
// Lone surrogates too (UTF-8 cannot hold one): a high one not followed by a low one, or a low
// one not after a high one (a pair is one character, which needs no escape).
const UNSAFE = /[%;"\\\x00-\x1f\x7f]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g
const ESCAPED = /%([0-9A-F]{2})/g

export const SEPARATOR = ';'

export function escapeFrame (name) {
  return name.replace(UNSAFE, c => c >= '\ud800'
    ? '%5Cu' + c.charCodeAt(0).toString(16) // written out, as the Python twin does
    : '%' + c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0'))
}

export function unescapeFrame (name) {
  return name.includes('%') ? name.replace(ESCAPED, (_, hex) => String.fromCharCode(parseInt(hex, 16))) : name
}

// The frames of a folded stack as people read them, root first.
export function displayFrames (stack) {
  return stack.split(SEPARATOR).map(unescapeFrame)
}

// The folded stack of frames given as people read them, root first.
export function foldedStack (names) {
  return names.map(escapeFrame).join(SEPARATOR)
}

// Characters that change how the text around them is shown without being seen (bidirectional
// overrides and isolates, zero-width characters, line separators): the twin of
// shown_frame in sampler/profile/frames.py. A name is shown with each as [U+XXXX].
const INVISIBLE = /[\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g

// A frame name (unescaped) as it may be put on a screen.
export function shownName (name) {
  return name.replace(INVISIBLE, c => '[U+' + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, '0') + ']')
}
