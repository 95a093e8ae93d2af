package main

import (
	"fmt"
	"io"
	"sort"
	"sync"
)

// nonFiniteCount is one tensor's NaN/±Inf values, as --json reports them.
type nonFiniteCount struct {
	Tensor string `json:"tensor"`
	Count  int64  `json:"count"`
}

// nonFiniteCounts aggregates counts reported per part of a tensor (from
// any goroutine) into one line per tensor.
type nonFiniteCounts struct {
	mu    sync.Mutex
	order []string
	n     map[string]int64
}

func (c *nonFiniteCounts) add(_ int, tensor string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	if _, ok := c.n[tensor]; !ok {
		c.order = append(c.order, tensor)
	}
	c.n[tensor] += n
}

// sorted is the counts by tensor name (deterministic for any worker count).
func (c *nonFiniteCounts) sorted() []nonFiniteCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]nonFiniteCount, 0, len(c.order))
	for _, t := range c.order {
		out = append(out, nonFiniteCount{t, c.n[t]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tensor < out[j].Tensor })
	return out
}

// warn prints one line per tensor on w: "cmd: warning: tensor T: N NaN/Inf
// values (why)".
func (c *nonFiniteCounts) warn(w io.Writer, cmd, why string) {
	for _, x := range c.sorted() {
		fmt.Fprintf(w, "%s: warning: tensor %s: %d NaN/Inf values (%s)\n", cmd, x.Tensor, x.Count, why)
	}
}
