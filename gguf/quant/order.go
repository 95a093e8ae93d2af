package quant

import "math"

// LoaderLess orders tensor names as llama.cpp's model loader keeps them
// (weights_map, a std::map with weight_name_comparer in
// src/llama-model-loader.h at 34af94c): by the block number that
// sscanf(name, "blk.%d.") reads, -1 for a name it reads none from, then by
// the bytes of the name (strcmp). llama-quantize types and writes tensors
// in this order, so its counters and its output follow it.
func LoaderLess(a, b string) bool {
	la, _ := blockOf(a)
	lb, _ := blockOf(b)
	if la != lb {
		return la < lb
	}
	return a < b
}

// BlockOf is the block (layer) number of a tensor name blk.N.…, as
// LoaderLess reads it; false for a name outside the blocks (token_embd,
// output, …).
func BlockOf(name string) (int, bool) {
	b, ok := blockOf(name)
	return int(b), ok && b >= 0
}

// blockOf is sscanf(name, "blk.%d.", &n) as glibc does it on a 64-bit
// target: the literal "blk." must match, then %d skips white space, takes
// an optional sign and at least one decimal digit, converts with strtol
// (saturating at the int64 range) and stores the low 32 bits. Whether the
// trailing "." matches does not matter: the count of conversions is 1
// either way. It returns -1 and false when nothing was converted.
func blockOf(name string) (int32, bool) {
	const prefix = "blk."
	if len(name) < len(prefix) || name[:len(prefix)] != prefix {
		return -1, false
	}
	s := name[len(prefix):]
	for len(s) > 0 && isCSpace(s[0]) {
		s = s[1:]
	}
	neg := false
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if len(s) == 0 || s[0] < '0' || s[0] > '9' {
		return -1, false
	}
	// Accumulate the magnitude as uint64, saturating like strtol.
	var mag uint64
	over := false
	for ; len(s) > 0 && '0' <= s[0] && s[0] <= '9'; s = s[1:] {
		d := uint64(s[0] - '0')
		if mag > (math.MaxUint64-d)/10 {
			over = true
			continue
		}
		mag = mag*10 + d
	}
	var v int64
	switch {
	case !neg && (over || mag > math.MaxInt64):
		v = math.MaxInt64
	case neg && (over || mag > 1<<63):
		v = math.MinInt64
	case neg:
		v = -int64(mag) // mag == 1<<63 wraps to MinInt64, as it should
	default:
		v = int64(mag)
	}
	return int32(v), true
}

// isCSpace is C's isspace in the "C" locale.
func isCSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}
