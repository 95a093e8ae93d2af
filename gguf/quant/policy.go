package quant

// Tensor is what a Policy sees of a tensor: its GGUF name and its ggml dims
// (ne[0], the row length along which blocks run, first). No weight data.
type Tensor struct {
	Name string
	Dims []uint64
}

// Policy chooses the ggml type a tensor is written as, given the type the
// user asked for (the --outtype of a converter, the default type of a
// quantizer's file type). It decides; the writer only encodes. Mixes such
// as Q4_K_M, and rules that keep norms or routers in F32, are policies.
//
// The caller checks the answer: a type with no encoder, or one whose blocks
// do not divide the row, is an error before any data is written.
type Policy func(t Tensor, want Type) Type
