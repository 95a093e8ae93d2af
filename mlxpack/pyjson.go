package mlxpack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
)

// The JSON files mlx-lm writes (config.json, model.safetensors.index.json)
// come from Python's json.dump(obj, f, indent=4): ensure_ascii escapes,
// separators "," and ": ", floats as repr() writes them, no final newline,
// and objects in the dict's insertion order. save_config sorts the top
// level only (dict(sorted(config.items()))), so a nested object such as
// text_config keeps the order json.load read it in, with a key sanitize
// added (rope_parameters' "type") at its end. pyJSON writes that format;
// keyOrder carries the source file's key order into it.

// keyOrder is the key order of one JSON object of a source file and of the
// objects below it.
type keyOrder struct {
	keys  []string
	sub   map[string]*keyOrder
	items []*keyOrder // for an array: each element's
}

// child is the order of the object under key k (nil if unknown).
func (o *keyOrder) child(k string) *keyOrder {
	if o == nil {
		return nil
	}
	return o.sub[k]
}

// item is the order of the i-th element of an array (nil if unknown).
func (o *keyOrder) item(i int) *keyOrder {
	if o == nil || i >= len(o.items) {
		return nil
	}
	return o.items[i]
}

// maxOrderDepth bounds the nesting keyOrderOf follows (a config is a few
// levels deep; deeper objects are written sorted).
const maxOrderDepth = 64

// keyOrderOf reads the key order of every object in a JSON document (data
// is already bounded by the caller: a config.json is at most 16 MiB).
func keyOrderOf(data []byte) (*keyOrder, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	o, err := readOrder(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("at offset %d: %w", dec.InputOffset(), err)
	}
	return o, nil
}

// readOrder consumes one value and returns the order of its objects (nil
// for a scalar).
func readOrder(dec *json.Decoder, depth int) (*keyOrder, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil, nil
	}
	o := &keyOrder{}
	keep := depth < maxOrderDepth
	switch d {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k, ok := kt.(string)
			if !ok {
				return nil, fmt.Errorf("object key %v is not a string", kt)
			}
			sub, err := readOrder(dec, depth+1)
			if err != nil {
				return nil, err
			}
			if !keep {
				continue
			}
			// A repeated key: Python keeps the first position, the last
			// value.
			if !seen[k] {
				seen[k] = true
				o.keys = append(o.keys, k)
			}
			if sub != nil {
				if o.sub == nil {
					o.sub = map[string]*keyOrder{}
				}
				o.sub[k] = sub
			} else {
				delete(o.sub, k)
			}
		}
	case '[':
		for dec.More() {
			sub, err := readOrder(dec, depth+1)
			if err != nil {
				return nil, err
			}
			if keep {
				o.items = append(o.items, sub)
			}
		}
	default:
		return nil, fmt.Errorf("unexpected %v", d)
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return nil, err
	}
	if !keep {
		return nil, nil
	}
	return o, nil
}

// pyJSON encodes v as Python's json.dumps(v, indent=4) does. Objects are
// map[string]any; a map's keys go in order's order (keys it does not list
// after them, sorted), or sorted when sortTop is set for the top level.
// Numbers are json.Number (written as Python reads and re-writes them),
// Go integers or floats. Any other value is marshalled with encoding/json
// first and written in the key order of that encoding (QuantBlock keeps
// mlx-lm's order so).
func pyJSON(v any, order *keyOrder, sortTop bool) ([]byte, error) {
	var b bytes.Buffer
	w := pyWriter{b: &b}
	if sortTop && order != nil {
		order = &keyOrder{sub: order.sub}
	}
	if err := w.value(v, order, 0); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

type pyWriter struct{ b *bytes.Buffer }

const pyIndent = "    "

func (w pyWriter) newline(level int) {
	w.b.WriteByte('\n')
	for i := 0; i < level; i++ {
		w.b.WriteString(pyIndent)
	}
}

func (w pyWriter) value(v any, order *keyOrder, level int) error {
	switch x := v.(type) {
	case nil:
		w.b.WriteString("null")
	case bool:
		w.b.WriteString(strconv.FormatBool(x))
	case string:
		pyString(w.b, x)
	case json.Number:
		s, err := pyNumber(x)
		if err != nil {
			return err
		}
		w.b.WriteString(s)
	case float64:
		w.b.WriteString(pyFloat(x))
	case float32:
		w.b.WriteString(pyFloat(float64(x)))
	case int:
		w.b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		w.b.WriteString(strconv.FormatInt(x, 10))
	case map[string]any:
		return w.object(x, order, level)
	case []any:
		return w.array(len(x), func(i int) any { return x[i] }, order, level)
	case []string:
		return w.array(len(x), func(i int) any { return x[i] }, order, level)
	default:
		rv := reflect.ValueOf(v)
		if k := rv.Kind(); k >= reflect.Int && k <= reflect.Int64 {
			w.b.WriteString(strconv.FormatInt(rv.Int(), 10))
			return nil
		}
		if k := rv.Kind(); k >= reflect.Uint && k <= reflect.Uint64 {
			w.b.WriteString(strconv.FormatUint(rv.Uint(), 10))
			return nil
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var back any
		if err := dec.Decode(&back); err != nil {
			return err
		}
		o, err := keyOrderOf(raw)
		if err != nil {
			return err
		}
		return w.value(back, o, level)
	}
	return nil
}

func (w pyWriter) object(m map[string]any, order *keyOrder, level int) error {
	if len(m) == 0 {
		w.b.WriteString("{}")
		return nil
	}
	keys := make([]string, 0, len(m))
	listed := map[string]bool{}
	if order != nil {
		for _, k := range order.keys {
			if _, ok := m[k]; ok && !listed[k] {
				listed[k] = true
				keys = append(keys, k)
			}
		}
	}
	rest := make([]string, 0, len(m)-len(keys))
	for k := range m {
		if !listed[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest) // Python sorts str keys by code point; Go strings by byte: the same order for UTF-8
	keys = append(keys, rest...)
	w.b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			w.b.WriteByte(',')
		}
		w.newline(level + 1)
		pyString(w.b, k)
		w.b.WriteString(": ")
		if err := w.value(m[k], order.child(k), level+1); err != nil {
			return err
		}
	}
	w.newline(level)
	w.b.WriteByte('}')
	return nil
}

func (w pyWriter) array(n int, at func(int) any, order *keyOrder, level int) error {
	if n == 0 {
		w.b.WriteString("[]")
		return nil
	}
	w.b.WriteByte('[')
	for i := 0; i < n; i++ {
		if i > 0 {
			w.b.WriteByte(',')
		}
		w.newline(level + 1)
		if err := w.value(at(i), order.item(i), level+1); err != nil {
			return err
		}
	}
	w.newline(level)
	w.b.WriteByte(']')
	return nil
}

// pyString writes s as json.dumps(ensure_ascii=True) does: \" \\ \n \r \t
// \b \f, every other character outside ' '…'~' as \uXXXX (lower-case hex,
// a surrogate pair above U+FFFF).
func pyString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	u := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&0xf])
		b.WriteByte(hex[r>>8&0xf])
		b.WriteByte(hex[r>>4&0xf])
		b.WriteByte(hex[r&0xf])
	}
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r >= ' ' && r <= '~':
				b.WriteRune(r)
			case r > 0xffff:
				r1, r2 := utf16.EncodeRune(r)
				u(r1)
				u(r2)
			default:
				u(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyNumber is what json.load then json.dump make of a JSON number: an
// integer literal stays as it is (Python ints are exact; -0 is 0), any
// other number becomes a float written by repr().
func pyNumber(n json.Number) (string, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		// A JSON integer (the decoder checked the literal): Python keeps
		// every digit.
		if s == "-0" {
			return "0", nil
		}
		return s, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// Out of float64 range: Python reads it as inf.
		if ne, ok := err.(*strconv.NumError); !ok || ne.Err != strconv.ErrRange {
			return "", fmt.Errorf("number %q: %w", s, err)
		}
	}
	return pyFloat(f), nil
}

// pyFloat is Python's repr(float) as json.dump writes it: the shortest
// digits that read back exactly, fixed notation with at least one
// fractional digit when the decimal exponent is in [-5, 16), else
// d.ddde±XX; Infinity, -Infinity and NaN.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	i := strings.LastIndexByte(e, 'e')
	exp, _ := strconv.Atoi(e[i+1:])
	if exp < -4 || exp >= 16 {
		return e // Go writes at least two exponent digits, as Python does
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}
