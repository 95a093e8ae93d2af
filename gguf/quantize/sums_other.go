//go:build !amd64

package quantize

// useAVX2 is false: there is no vector form of sumLanes on this
// architecture.
var useAVX2 = false

// sumLanes is sumLanesGo.
func sumLanes(x, y []float32, acc *lanes) { sumLanesGo(x, y, acc) }
