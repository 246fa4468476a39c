package framing

import (
	"encoding/base64"
	"unicode/utf8"
)

// JSON lines framing (format=json on the public endpoint, and dhtkvctl
// scan --json): one JSON object per record, each on its own line.
//
//	{"key":"fruit/apple","value":"red"}
//	{"key_base64":"AP8=","value":"binary key"}
//	{"key":"photo","value_base64":"/9j/4AAQ"}
//
// Invariants, which a reader may rely on:
//
//   - every object has exactly one of "key" and "key_base64", and exactly
//     one of "value" and "value_base64" (AppendJSONKey: neither value
//     field);
//   - "key" and "value" are JSON strings holding exactly the stored bytes,
//     used when those bytes are valid UTF-8 (control characters, NUL
//     included, are escaped as JSON requires, so they round-trip);
//   - "key_base64" and "value_base64" are the stored bytes in standard,
//     padded base64 (RFC 4648 §4), used when the bytes are not valid UTF-8,
//     which a JSON string cannot carry without loss;
//   - the fields come in the order key, value; nothing else is in the
//     object, and a line ends with '\n' and holds no other '\n'.
//
// Unlike the binary framing, JSON lines have no end marker: a stream cut
// short is visible only at the HTTP level (a chunked body without its
// terminating chunk). Readers that must tell a complete result from a
// truncated one without trusting their HTTP layer use format=binary.

// AppendJSON appends one record of the JSON lines framing to dst: an
// object with the key and the value, and '\n'.
func AppendJSON(dst, key, value []byte) []byte {
	dst = appendJSONField(append(dst, '{'), "key", key)
	dst = appendJSONField(append(dst, ','), "value", value)
	return append(dst, '}', '\n')
}

// AppendJSONStart appends the start of one record of the JSON lines
// framing, AppendJSON's bytes in pieces: the whole object when value is
// not valid UTF-8 (more false), else up to the opening quote of the
// value's string (more true), whose rest AppendJSONValuePart appends.
// A value escaped whole could take six times its size (\u00XX a byte).
func AppendJSONStart(dst, key, value []byte) (_ []byte, more bool) {
	dst = appendJSONField(append(dst, '{'), "key", key)
	if !utf8.Valid(value) {
		dst = appendJSONField(append(dst, ','), "value", value)
		return append(dst, '}', '\n'), false
	}
	return append(dst, `,"value":"`...), true
}

// AppendJSONValuePart appends the escaped form of value's first most
// bytes or so (whole runes, at least one), and returns the rest; once
// none is left (done), the string's and the object's ends and '\n'.
func AppendJSONValuePart(dst, value []byte, most int) (_, rest []byte, done bool) {
	n := min(len(value), max(most, 1))
	for n < len(value) && !utf8.RuneStart(value[n]) {
		n++
	}
	dst = appendJSONStringBody(dst, value[:n])
	if n < len(value) {
		return dst, value[n:], false
	}
	return append(dst, '"', '}', '\n'), nil, true
}

// AppendJSONKey appends an object with the key only, and '\n' (a listing
// of keys).
func AppendJSONKey(dst, key []byte) []byte {
	dst = appendJSONField(append(dst, '{'), "key", key)
	return append(dst, '}', '\n')
}

// appendJSONField appends "name":"b" when b is valid UTF-8, else
// "name_base64":"base64 of b".
func appendJSONField(dst []byte, name string, b []byte) []byte {
	dst = append(dst, '"')
	dst = append(dst, name...)
	if !utf8.Valid(b) {
		dst = append(dst, `_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, b)
		return append(dst, '"')
	}
	dst = append(dst, `":`...)
	return appendJSONString(dst, b)
}

// appendJSONString appends b, valid UTF-8, as a JSON string. The output is
// byte for byte encoding/json's with SetEscapeHTML(false) (checked by
// FuzzJSONString): the standard library has no append API for it, and
// json.Marshal would allocate twice per record.
func appendJSONString(dst, b []byte) []byte {
	return append(appendJSONStringBody(append(dst, '"'), b), '"')
}

// appendJSONStringBody is appendJSONString without the quotes: b split
// at rune boundaries gives the same bytes piece by piece.
func appendJSONStringBody(dst, b []byte) []byte {
	const hex = "0123456789abcdef"
	start := 0 // b[start:i] is pending, needing no escape
	for i := 0; i < len(b); {
		c := b[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(b[i:])
			if r == '\u2028' || r == '\u2029' { // line separators: JavaScript would break the line
				dst = append(dst, b[start:i]...)
				dst = append(dst, `\u202`...)
				dst = append(dst, hex[r&0xf])
				start = i + size
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, b[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	return append(dst, b[start:]...)
}
