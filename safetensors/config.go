package safetensors

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Config is a model's config.json. Get and the typed accessors read a merged
// view: the top level with text_config's keys laid over it, so callers read
// hidden_size the same way for Qwen3_5ForCausalLM and for the text part of
// Qwen3_5ForConditionalGeneration.
type Config struct {
	Path          string
	Raw           map[string]any // as parsed, numbers as json.Number
	Architectures []string
	ModelType     string // the top-level model_type
	merged        map[string]any
}

const maxConfigSize = 16 << 20

// ReadConfig parses a config.json.
func ReadConfig(path string) (*Config, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigSize {
		return nil, errf(path, "", -1, ErrInvalidConfig, "config over %d bytes", maxConfigSize)
	}
	return ParseConfig(data, path)
}

// ParseConfig parses config JSON; path is used in errors.
func ParseConfig(data []byte, path string) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, errf(path, "", dec.InputOffset(), ErrInvalidConfig, "config is not a JSON object: %v", err)
	}
	if raw == nil {
		return nil, errf(path, "", 0, ErrInvalidConfig, "config is null, not a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errf(path, "", dec.InputOffset(), ErrInvalidConfig, "data after the config object")
	}
	if where, n := overflowing(raw, ""); where != "" {
		// Python reads such a float as inf and writes it back as the
		// literal Infinity, which no JSON reader takes: refused here.
		return nil, errf(path, "", 0, ErrInvalidConfig, "%s: the number %s is out of a float's range", where, n)
	}
	c := &Config{Path: path, Raw: raw, merged: map[string]any{}}
	for k, v := range raw {
		c.merged[k] = v
	}
	if tc, ok := raw["text_config"].(map[string]any); ok {
		for k, v := range tc {
			if k == "model_type" || k == "architectures" {
				continue
			}
			c.merged[k] = v
		}
	}
	if a, ok := raw["architectures"].([]any); ok {
		for _, v := range a {
			if s, ok := v.(string); ok {
				c.Architectures = append(c.Architectures, s)
			}
		}
	}
	c.ModelType, _ = raw["model_type"].(string)
	return c, nil
}

// overflowing finds a float in v (a decoded config, numbers as
// json.Number) beyond float64's range: its key path and literal.
func overflowing(v any, at string) (string, json.Number) {
	switch x := v.(type) {
	case json.Number:
		if strings.ContainsAny(string(x), ".eE") {
			if _, err := strconv.ParseFloat(string(x), 64); err != nil {
				return cmp.Or(at, "the config"), x
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // the same key named every time
		for _, k := range keys {
			if w, n := overflowing(x[k], strings.TrimPrefix(at+"."+k, ".")); w != "" {
				return w, n
			}
		}
	case []any:
		for i, e := range x {
			if w, n := overflowing(e, fmt.Sprintf("%s[%d]", at, i)); w != "" {
				return w, n
			}
		}
	}
	return "", ""
}

// Architecture is architectures[0], or "".
func (c *Config) Architecture() string {
	if c == nil || len(c.Architectures) == 0 {
		return ""
	}
	return c.Architectures[0]
}

// Get reads a key from the merged view.
func (c *Config) Get(key string) (any, bool) {
	if c == nil {
		return nil, false
	}
	v, ok := c.merged[key]
	return v, ok
}

// Int reads an integer key from the merged view.
func (c *Config) Int(key string) (int64, bool) {
	v, ok := c.Get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

// Float reads a numeric key from the merged view.
func (c *Config) Float(key string) (float64, bool) {
	v, ok := c.Get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

// String reads a string key from the merged view.
func (c *Config) String(key string) (string, bool) {
	v, ok := c.Get(key)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

// Bool reads a boolean key from the merged view.
func (c *Config) Bool(key string) (bool, bool) {
	v, ok := c.Get(key)
	if !ok {
		return false, false
	}
	b, ok := v.(bool)
	return b, ok
}

// MTPLayers is the number of multi-token-prediction layers the config
// promises, from Qwen's mtp_num_hidden_layers or DeepSeek/GLM's
// num_nextn_predict_layers (0 if neither).
func (c *Config) MTPLayers() int64 {
	if n, ok := c.Int("mtp_num_hidden_layers"); ok {
		return n
	}
	if n, ok := c.Int("num_nextn_predict_layers"); ok {
		return n
	}
	return 0
}
