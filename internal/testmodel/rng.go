package testmodel

import (
	"hash/fnv"
	"math"
)

// splitmix64 is a tiny, fast, well-mixed generator (Steele, Lea & Flood,
// "Fast splittable pseudorandom number generators", 2014). Every tensor gets
// its own stream, seeded from the model seed and the tensor name, so a
// tensor's values never depend on which other tensors a model has.
type splitmix64 struct{ s uint64 }

func (r *splitmix64) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a float64 in (0, 1): 53 random bits, never exactly 0, so
// log() in Box–Muller is always finite.
func (r *splitmix64) uniform() float64 {
	return (float64(r.next()>>11) + 0.5) / (1 << 53)
}

// normal returns one standard normal sample. It uses two uniforms per value
// (Box–Muller, cosine branch only) so value i depends only on the stream
// position, not on how the caller chunks the tensor.
func (r *splitmix64) normal() float64 {
	u1, u2 := r.uniform(), r.uniform()
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// streamSeed mixes a seed and a name into the start state of a stream.
func streamSeed(seed uint64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	r := splitmix64{s: seed ^ h.Sum64()}
	return r.next()
}

// InitKind says how a tensor's values are drawn.
type InitKind int

const (
	// Normal draws N(A, B²): mean A, standard deviation B.
	Normal InitKind = iota
	// Uniform draws U(A, B).
	Uniform
	// LogUniform draws log(U(A, B)), the way transformers initialises the
	// Gated DeltaNet A_log (log of U(0, 16)); A must be > 0.
	LogUniform
	// Constant fills every element with A.
	Constant
)

// Init describes the distribution of one tensor's values.
type Init struct {
	Kind InitKind
	A, B float64
}

// NormalInit is N(mean, std²).
func NormalInit(mean, std float64) Init { return Init{Normal, mean, std} }

// UniformInit is U(lo, hi).
func UniformInit(lo, hi float64) Init { return Init{Uniform, lo, hi} }

func (in Init) draw(r *splitmix64) float32 {
	switch in.Kind {
	case Uniform:
		return float32(in.A + (in.B-in.A)*r.uniform())
	case LogUniform:
		return float32(math.Log(in.A + (in.B-in.A)*r.uniform()))
	case Constant:
		return float32(in.A)
	default:
		return float32(in.A + in.B*r.normal())
	}
}

// Values returns the first n deterministic float32 values of the stream for
// (seed, name) drawn from init, before any rounding to a storage dtype.
// With block > 0 the stream restarts every block elements (value i equals
// value i mod block), which is what the fast large-model generator writes.
// Model.Values returns the same numbers rounded through the stored dtype.
func Values(seed uint64, name string, n int64, init Init, block int64) []float32 {
	out := make([]float32, n)
	g := newGen(seed, name, init, block)
	g.fill(out)
	return out
}

// gen produces a tensor's values in order, in chunks of any size.
type gen struct {
	init  Init
	start uint64
	r     splitmix64
	block int64 // 0: no repetition
	pos   int64 // index within the current block
}

func newGen(seed uint64, name string, init Init, block int64) *gen {
	s := streamSeed(seed, name)
	return &gen{init: init, start: s, r: splitmix64{s: s}, block: block}
}

func (g *gen) fill(dst []float32) {
	for i := range dst {
		if g.block > 0 && g.pos == g.block {
			g.r = splitmix64{s: g.start}
			g.pos = 0
		}
		dst[i] = g.init.draw(&g.r)
		g.pos++
	}
}
