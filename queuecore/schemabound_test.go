package queuecore

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// nestedAllOf is n levels of allOf pairs through $defs: 2^n subschemas
// applied to one value in a document of a few hundred bytes.
func nestedAllOf(n int) string {
	var defs []string
	for i := 0; i < n; i++ {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, fmt.Sprintf(`"d%d":{"type":"object"}`, n))
	return `{"$ref":"#/$defs/d0","$defs":{` + strings.Join(defs, ",") + `}}`
}

// Schemas too big, too deep or too costly are refused when the policy is
// written, quickly, with a reason; the time to refuse each is logged.
func TestSchemaBounds(t *testing.T) {
	deep := strings.Repeat(`{"items":`, 9990) + `{}` + strings.Repeat(`}`, 9990)
	deep65 := strings.Repeat(`{"not":`, 65) + `{}` + strings.Repeat(`}`, 65)
	props := make([]string, 0, 4000)
	for i := 0; i < 4000; i++ {
		props = append(props, fmt.Sprintf(`"p%04d":{"type":"string"}`, i))
	}
	big := `{"properties":{` + strings.Join(props, ",") + `}}`
	wide := `{"anyOf":[` + strings.Repeat(`{},`, 20500) + `{}]}`
	cases := []struct{ name, schema, why string }{
		{"9990 levels", deep, "bytes"},
		{"2000 levels", strings.Repeat(`{"not":`, 2000) + `{}` + strings.Repeat(`}`, 2000), "nested"},
		{"65 levels", deep65, "nested"},
		{"100 KB", big, "bytes"},
		{"22 allOf pairs", nestedAllOf(22), "subschemas"},
		{"15 allOf pairs", nestedAllOf(15), "subschemas"},
		{"20500 inline", wide, "subschemas"},
	}
	for _, c := range cases {
		doc := `{"format":"json","schema":` + c.schema + `}`
		start := time.Now()
		_, err := ParsePolicy([]byte(doc))
		took := time.Since(start)
		t.Logf("%-15s %7d bytes: refused in %v: %v", c.name, len(doc), took.Round(time.Microsecond), err)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.why)
		}
	}
	// Within the bounds: accepted.
	for _, s := range []string{nestedAllOf(8), strings.Repeat(`{"not":`, 60) + `{}` + strings.Repeat(`}`, 60),
		`{"type":"object","properties":{"a":{"$ref":"#"}}}`} {
		if _, err := ParsePolicy([]byte(`{"format":"json","schema":` + s + `}`)); err != nil {
			t.Errorf("schema %.60s refused: %v", s, err)
		}
	}
}

// A message whose validation takes longer than the bound is refused with
// that reason (the time is logged, not asserted: the machine is shared).
func TestSchemaValidationBounded(t *testing.T) {
	// Within the static bounds, but slow on a long string: a pattern is
	// linear in Go, so make the value big and the checks many.
	p, err := ParsePolicy([]byte(`{"format":"json","maxMessageBytes":67108864,"schema":{"items":{"allOf":[` +
		strings.Repeat(`{"pattern":"a.*b.*c.*d"},`, 200) + `{}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	item := `"` + strings.Repeat("a", 64<<10) + `"`
	body := []byte(`[` + strings.Repeat(item+",", 63) + item + `]`)
	start := time.Now()
	_, err = p.checkBody("q", body, time.Now())
	took := time.Since(start)
	t.Logf("validation of %d bytes stopped after %v: %v", len(body), took, err)
	if err != errSchemaTimeout {
		t.Fatalf("error %v, want %v", err, errSchemaTimeout)
	}
}

// What SetPolicy stores is compact and loads again under the same limits.
func TestStoredPolicyCompact(t *testing.T) {
	doc := `{"format": "json", "schema": {"description": "<a & b>", "type":    "object"}}`
	p, err := ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	stored := p.StoredJSON()
	if strings.Contains(string(stored), `\u003c`) || strings.Contains(string(stored), "  ") || strings.Contains(string(stored), "\n") {
		t.Errorf("stored form not compact: %s", stored)
	}
	if _, err := ParsePolicy(stored); err != nil {
		t.Errorf("stored form does not load: %v", err)
	}
}

// A schema within the static bounds whose compile and test validation
// take longer than the bound is refused with that reason. (The bound is
// made tiny here: how long a compile takes depends on the machine.)
func TestSchemaCompileBounded(t *testing.T) {
	old := schemaCompileTimeout
	schemaCompileTimeout = time.Nanosecond
	defer func() { schemaCompileTimeout = old }()
	_, err := ParsePolicy([]byte(`{"format":"json","schema":` + nestedAllOf(10) + `}`))
	if err == nil || !strings.Contains(err.Error(), "took more than") {
		t.Fatalf("error %v, want the compile bound", err)
	}
	// The compile that ran out of time still gives its slot back.
	schemaCompileTimeout = old
	for i := 0; i < 3*cap(compileSlots); i++ {
		if _, err := ParsePolicy([]byte(`{"format":"json","schema":{"type":"object"}}`)); err != nil {
			t.Fatalf("a plain schema after a timed-out one: %v", err)
		}
	}
}
