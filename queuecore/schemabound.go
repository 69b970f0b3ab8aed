package queuecore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// A policy's schema is untrusted input that the daemon compiles once and
// runs on every publish, so its cost is bounded before it is accepted and
// while it runs (docs/multiuser.md):
//
//   - at most maxSchemaBytes of compact JSON, nested at most maxSchemaDepth
//     deep;
//   - at most maxSchemaChecks subschemas applied to one value, counted with
//     every $ref followed (22 nested allOf pairs of $ref are 2^22 checks in
//     1.4 KB);
//   - compiling it and validating a few test values within
//     schemaCompileTimeout, so that the close of .policy never waits long;
//   - validating one message within schemaValidateTimeout, past which the
//     message is refused with that reason.
const (
	maxSchemaBytes  = 64 << 10
	maxSchemaDepth  = 64
	maxSchemaChecks = 20000
)

// Variables only for the tests of the time bounds.
var (
	schemaCompileTimeout  = time.Second
	schemaValidateTimeout = 500 * time.Millisecond
)

// compileSchemaBounded checks the static bounds of a schema, then compiles
// it and test-validates it within schemaCompileTimeout.
func compileSchemaBounded(doc []byte, compile bool) (*jsonschema.Schema, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, doc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if compact.Len() > maxSchemaBytes {
		return nil, fmt.Errorf("schema is %d bytes, more than %d", compact.Len(), maxSchemaBytes)
	}
	if d := jsonDepth(compact.Bytes()); d > maxSchemaDepth {
		return nil, fmt.Errorf("schema is nested %d deep, more than %d", d, maxSchemaDepth)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(compact.Bytes()))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if n := schemaChecks(v); n > maxSchemaChecks {
		return nil, fmt.Errorf("schema applies more than %d subschemas to one value (with its $refs followed): too costly to run on every message", maxSchemaChecks)
	}
	type result struct {
		s   *jsonschema.Schema
		err error
	}
	if !compile {
		return nil, nil
	}
	t := time.NewTimer(schemaCompileTimeout)
	defer t.Stop()
	if !takeSlot(compileSlots, t.C) {
		return nil, fmt.Errorf("other schemas are still compiling: try again later")
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-compileSlots }()
		s, err := compileSchema(v)
		if err == nil {
			// A few values every schema must get through quickly.
			for _, t := range []any{nil, map[string]any{}, []any{}, "", json.Number("0"), true} {
				_ = s.Validate(t)
			}
		}
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-t.C:
		// The compile goes on in its goroutine and its result is dropped;
		// the bounds above keep it from going on for long.
		return nil, fmt.Errorf("compiling and test-validating the schema took more than %v", schemaCompileTimeout)
	}
}

// A compile or a validation that ran out of time cannot be stopped: it
// goes on in its goroutine until it ends. The slots bound how many run at
// once, so that repeating a costly schema or message cannot take every
// CPU: a new one waits for a slot within its own time bound, else it is
// refused.
var (
	compileSlots  = make(chan struct{}, 2)
	validateSlots = make(chan struct{}, 16)
)

// takeSlot takes a free slot at once, else waits for one until timeout.
func takeSlot(slots chan struct{}, timeout <-chan time.Time) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	select {
	case slots <- struct{}{}:
		return true
	case <-timeout:
		return false
	}
}

// validateBounded validates v against s within schemaValidateTimeout.
func validateBounded(s *jsonschema.Schema, v any) error {
	t := time.NewTimer(schemaValidateTimeout)
	defer t.Stop()
	if !takeSlot(validateSlots, t.C) {
		return errSchemaTimeout
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-validateSlots }()
		done <- s.Validate(v)
	}()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return errSchemaTimeout
	}
}

var errSchemaTimeout = fmt.Errorf("validating the message against the schema took more than %v", schemaValidateTimeout)

// (errSchemaTimeout names the bound as it is when the daemon starts.)

// jsonDepth returns how deep valid JSON nests arrays and objects.
func jsonDepth(b []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}

// Keywords whose value is one subschema, an array of them, or an object of
// them, applied to the value or its parts.
var (
	oneSub = map[string]bool{"not": true, "if": true, "then": true, "else": true, "items": true,
		"additionalItems": true, "contains": true, "additionalProperties": true, "propertyNames": true,
		"unevaluatedItems": true, "unevaluatedProperties": true, "contentSchema": true}
	arraySub = map[string]bool{"allOf": true, "anyOf": true, "oneOf": true, "prefixItems": true, "items": true}
	mapSub   = map[string]bool{"properties": true, "patternProperties": true, "dependentSchemas": true, "dependencies": true}
)

// schemaChecks estimates how many subschemas a schema applies to one value,
// following $ref and $dynamicRef to places in the same document (each
// place counted with its own cost, memoized; a reference back into a place
// being counted counts once, since recursion is bounded by the value).
// The count saturates just past maxSchemaChecks.
func schemaChecks(root any) int {
	anchors := map[string]any{}
	collectAnchors(root, anchors, 0)
	memo := map[string]int{}
	busy := map[string]bool{}
	var cost func(node any, ptr string) int
	cost = func(node any, ptr string) int {
		obj, ok := node.(map[string]any)
		if !ok {
			return 1 // true, false, or not a schema
		}
		if n, ok := memo[ptr]; ok {
			return n
		}
		if busy[ptr] {
			return 1
		}
		busy[ptr] = true
		n := 1
		add := func(k int) { n = min(n+k, maxSchemaChecks+1) }
		for key, v := range obj {
			p := ptr + "/" + escapePointer(key)
			switch {
			case key == "$ref" || key == "$dynamicRef" || key == "$recursiveRef":
				if s, ok := v.(string); ok {
					if target, tptr, ok := resolveLocal(root, anchors, s); ok {
						add(cost(target, tptr))
					}
				}
			case arraySub[key]:
				if a, ok := v.([]any); ok {
					for i, e := range a {
						add(cost(e, p+"/"+strconv.Itoa(i)))
					}
				} else if oneSub[key] {
					add(cost(v, p))
				}
			case oneSub[key]:
				add(cost(v, p))
			case mapSub[key]:
				if m, ok := v.(map[string]any); ok {
					for k, e := range m {
						add(cost(e, p+"/"+escapePointer(k)))
					}
				}
			}
		}
		delete(busy, ptr)
		memo[ptr] = n
		return n
	}
	return cost(root, "")
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// collectAnchors finds the $anchor and $dynamicAnchor names (#name
// references) with the JSON pointer of their schema.
func collectAnchors(node any, out map[string]any, depth int) {
	if depth > maxSchemaDepth {
		return
	}
	switch v := node.(type) {
	case map[string]any:
		for _, k := range []string{"$anchor", "$dynamicAnchor"} {
			if name, ok := v[k].(string); ok {
				out[name] = v
			}
		}
		for _, e := range v {
			collectAnchors(e, out, depth+1)
		}
	case []any:
		for _, e := range v {
			collectAnchors(e, out, depth+1)
		}
	}
}

// resolveLocal finds what a reference inside the document points to: "#",
// "#/json/pointer" or "#anchor". Other references (to other documents)
// are refused by the compiler anyway.
func resolveLocal(root any, anchors map[string]any, ref string) (any, string, bool) {
	_, frag, ok := strings.Cut(ref, "#")
	if !ok {
		return nil, "", false
	}
	if frag != "" && frag[0] != '/' {
		a, ok := anchors[frag]
		return a, "#" + frag, ok
	}
	node := root
	if frag == "" {
		return node, "", true
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := node.(type) {
		case map[string]any:
			if node, ok = v[tok]; !ok {
				return nil, "", false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, "", false
			}
			node = v[i]
		default:
			return nil, "", false
		}
	}
	return node, frag, true
}
