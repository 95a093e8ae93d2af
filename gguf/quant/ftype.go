package quant

import (
	"fmt"
	"strconv"
)

// FileType is llama.cpp's llama_ftype (include/llama.h; gguf-py
// LlamaFileType), the value of general.file_type: which type most of a
// file's tensors have. Codes 4, 5, 6 and 33–35 were removed upstream; the IQ
// and TQ mixes are not listed here.
type FileType uint32

// File types (llamacpp.md §3.3). The K-quant mixes differ in which tensors
// get a larger type, not in their default type.
const (
	FileF32    FileType = 0 // LLAMA_FTYPE_ALL_F32
	FileF16    FileType = 1
	FileQ4_0   FileType = 2
	FileQ4_1   FileType = 3
	FileQ8_0   FileType = 7
	FileQ5_0   FileType = 8
	FileQ5_1   FileType = 9
	FileQ2_K   FileType = 10
	FileQ3_K_S FileType = 11
	FileQ3_K_M FileType = 12
	FileQ3_K_L FileType = 13
	FileQ4_K_S FileType = 14
	FileQ4_K_M FileType = 15
	FileQ5_K_S FileType = 16
	FileQ5_K_M FileType = 17
	FileQ6_K   FileType = 18
	FileQ2_K_S FileType = 21 // needs an importance matrix
	FileBF16   FileType = 32
)

type fileTraits struct {
	name string // llama-quantize's name for it
	def  Type   // llama_ftype_get_default_type
}

var fileTable = map[FileType]fileTraits{
	FileF32:    {"F32", F32},
	FileF16:    {"F16", F16},
	FileQ4_0:   {"Q4_0", Q4_0},
	FileQ4_1:   {"Q4_1", Q4_1},
	FileQ8_0:   {"Q8_0", Q8_0},
	FileQ5_0:   {"Q5_0", Q5_0},
	FileQ5_1:   {"Q5_1", Q5_1},
	FileQ2_K:   {"Q2_K", Q2_K},
	FileQ3_K_S: {"Q3_K_S", Q3_K},
	FileQ3_K_M: {"Q3_K_M", Q3_K},
	FileQ3_K_L: {"Q3_K_L", Q3_K},
	FileQ4_K_S: {"Q4_K_S", Q4_K},
	FileQ4_K_M: {"Q4_K_M", Q4_K},
	FileQ5_K_S: {"Q5_K_S", Q5_K},
	FileQ5_K_M: {"Q5_K_M", Q5_K},
	FileQ6_K:   {"Q6_K", Q6_K},
	FileQ2_K_S: {"Q2_K_S", Q2_K},
	FileBF16:   {"BF16", BF16},
}

// Known reports whether f is a file type listed here.
func (f FileType) Known() bool { _, ok := fileTable[f]; return ok }

// String is llama-quantize's name for f ("Q4_K_M", "BF16", …), or
// "ftype(N)" when unknown.
func (f FileType) String() string {
	if i, ok := fileTable[f]; ok {
		return i.name
	}
	return fmt.Sprintf("ftype(%d)", uint32(f))
}

// Default is the type a tensor of a file of type f gets when no rule says
// otherwise (llama_ftype_get_default_type), or false when f is unknown.
func (f FileType) Default() (Type, bool) {
	i, ok := fileTable[f]
	return i.def, ok
}

// FileTypeOf is the file type whose tensors are mostly t, for the types a
// converter writes throughout (F32, F16, BF16, and the legacy quants), or
// false for the K-quants, whose file types are mixes.
func FileTypeOf(t Type) (FileType, bool) {
	for _, f := range []FileType{FileF32, FileF16, FileBF16, FileQ4_0, FileQ4_1, FileQ5_0, FileQ5_1, FileQ8_0} {
		if fileTable[f].def == t {
			return f, true
		}
	}
	return 0, false
}

// unsupportedFileTypes are the llama_ftype values llama-quantize makes
// and ferry does not, by llama-quantize's name (include/llama.h and
// tools/quantize/quantize.cpp QUANT_OPTIONS at 34af94c).
var unsupportedFileTypes = map[FileType]string{
	19: "IQ2_XXS", 20: "IQ2_XS", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S",
	27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 36: "TQ1_0", 37: "TQ2_0",
	38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

// fileTypeAliases are llama-quantize's short names for the medium mixes.
var fileTypeAliases = map[string]FileType{"Q3_K": FileQ3_K_M, "Q4_K": FileQ4_K_M, "Q5_K": FileQ5_K_M}

// LookupFileType parses a type argument of llama-quantize: a name such as
// Q4_K_M, in any ASCII case, an alias (Q3_K, Q4_K and Q5_K are the _M
// mixes), or a llama_ftype number in decimal. It returns an error wrapping
// ErrUnsupportedFileType for a type llama-quantize makes and ferry does
// not (the IQ, TQ and FP4 mixes, and COPY), and a plain error for a name
// llama-quantize does not know either. Unlike llama-quantize, which reads
// a number with std::stoi, a number with anything after its digits is
// refused.
func LookupFileType(s string) (FileType, error) {
	up := asciiUpper(s)
	if f, ok := fileTypeAliases[up]; ok {
		return f, nil
	}
	for f, t := range fileTable {
		if t.name == up {
			return f, nil
		}
	}
	for f, name := range unsupportedFileTypes {
		if name == up {
			return f, fmt.Errorf("%s: %w", name, ErrUnsupportedFileType)
		}
	}
	if up == "COPY" {
		return 0, fmt.Errorf("COPY: %w", ErrUnsupportedFileType)
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		f := FileType(n)
		if f.Known() {
			return f, nil
		}
		if name, ok := unsupportedFileTypes[f]; ok {
			return f, fmt.Errorf("%s: %w", name, ErrUnsupportedFileType)
		}
	}
	return 0, fmt.Errorf("unknown file type %q", s)
}

// ParseFileType is LookupFileType for the file types Mix makes: false for
// anything else.
func ParseFileType(s string) (FileType, bool) {
	f, err := LookupFileType(s)
	return f, err == nil
}

func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}
