package flashattn_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"flashattn.dev/flashattn"
)

// The five lines docs/bindings.md (and the README) show, between the lines that make the data.
func Example() {
	q := make([]float32, 1*16*2*8)
	for i := range q {
		q[i] = float32(i%7) / 7
	}
	k, v := q, q
	ctx, err := flashattn.NewContext(flashattn.CPU, 0) // or flashattn.CUDA on a GPU
	defer ctx.Close()
	dims := flashattn.Dims{Batch: 1, SeqLenQ: 16, SeqLenK: 16, HeadsQ: 2, HeadsKV: 2, HeadDim: 8}
	out, lse, err := ctx.Attention(dims, q, k, v, &flashattn.Options{Causal: true}) // q, k, v []float32
	fmt.Println(len(out), len(lse), err)
	// Output: 256 32 <nil>
}

// The lines of docs/bindings.md's Variants section, between the lines that make the data: two
// sequences of 4 and 6 tokens packed, a window, a softcap and sinks.
func Example_variants() {
	q := make([]float32, 10*2*8)
	for i := range q {
		q[i] = float32(i%5) / 5
	}
	k, v, dout := q, q, q
	ctx, err := flashattn.NewContext(flashattn.CPU, 0)
	defer ctx.Close()
	dims := flashattn.Dims{Batch: 2, SeqLenQ: 10, SeqLenK: 10, HeadsQ: 2, HeadsKV: 2, HeadDim: 8} // packed: q [10, 2, 8]
	vars := &flashattn.Variants{CuSeqlensQ: []int32{0, 4, 10}, CuSeqlensK: []int32{0, 4, 10}, Sinks: []float32{0, 0}}
	opts := &flashattn.Options{Window: &flashattn.Window{Left: 3, Right: 0}, Softcap: 30}
	out, lse, err := ctx.AttentionEx(dims, q, k, v, opts, vars)
	_, _, _, dsinks, err := ctx.AttentionBackwardEx(dims, q, k, v, out, dout, lse, opts, vars)
	fmt.Println(len(out), len(lse), len(dsinks), err)
	// Output: 160 20 2 <nil>
}

// The lines of docs/bindings.md's KV cache section, between the lines that make the data: one
// decode step of two sequences over a paged cache (pages of 8 rows; sequence 0 in page 2,
// sequence 1 in pages 0 and 3, page 1 unused), each appending its new token's row.
func Example_kvCache() {
	q, kNew, vNew := make([]float32, 2*1*2*8), make([]float32, 2*1*2*8), make([]float32, 2*1*2*8)
	for i := range q {
		q[i], kNew[i], vNew[i] = float32(i%5)/5, 1, 1
	}
	kPages, vPages := make([]float32, 4*8*2*8), make([]float32, 4*8*2*8)
	ctx, err := flashattn.NewContext(flashattn.CPU, 0)
	defer ctx.Close()
	dims := flashattn.Dims{Batch: 2, SeqLenQ: 1, HeadsQ: 2, HeadsKV: 2, HeadDim: 8} // one query (the new token) per sequence
	cache := &flashattn.KVCache{SeqLens: []int32{5, 12}, BlockTable: []int32{2, -1, 0, 3}, PageSize: 8, KNew: kNew, VNew: vNew}
	out, lse, err := ctx.AttentionKVCache(dims, q, kPages, vPages, cache, &flashattn.Options{Causal: true}, nil)
	fmt.Println(len(out), len(lse), kPages[(2*8+5)*2*8], err) // kPages [4, 8, 2, 8]: sequence 0's token 5 is page 2's row 5
	// Output: 32 4 1 <nil>
}

// docsBlock is the first go block of docs/bindings.md under the heading section, as lines.
func docsBlock(t *testing.T, section string) []string {
	t.Helper()
	docs, err := os.ReadFile("../../docs/bindings.md")
	if err != nil {
		t.Skipf("docs/bindings.md is not beside this test binary: %v", err)
	}
	_, rest, ok := strings.Cut(string(docs), "## "+section+"\n")
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(rest)
	if !ok || block == nil {
		t.Fatalf("docs/bindings.md has no go block under %s", section)
	}
	return strings.Split(strings.TrimSpace(block[1]), "\n")
}

// checkDocumented fails for each documented line that the function example of example_test.go
// does not hold.
func checkDocumented(t *testing.T, lines []string, example string) {
	t.Helper()
	source, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(source), "\nfunc "+example+"() {\n")
	body, _, _ = strings.Cut(body, "\n}\n")
	if !ok {
		t.Fatalf("example_test.go has no %s", example)
	}
	for _, line := range lines {
		if !strings.Contains(body+"\n", "\t"+line+"\n") {
			t.Errorf("the documented line %q is not in %s", line, example)
		}
	}
}

func TestDocsShowTheVariantsExample(t *testing.T) {
	checkDocumented(t, docsBlock(t, "Variants"), "Example_variants")
}

func TestDocsShowTheKVCacheExample(t *testing.T) {
	checkDocumented(t, docsBlock(t, "KV cache"), "Example_kvCache")
}

func TestDocsShowTheExample(t *testing.T) {
	docs, err := os.ReadFile("../../docs/bindings.md")
	if err != nil {
		t.Skipf("docs/bindings.md is not beside this test binary: %v", err)
	}
	source, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(docs)
	if block == nil {
		t.Fatal("docs/bindings.md has no go block")
	}
	lines := strings.Split(strings.TrimSpace(string(block[1])), "\n")
	if len(lines) != 5 {
		t.Errorf("the go block has %d lines, not 5", len(lines))
	}
	for _, line := range lines {
		if !strings.Contains(string(source), "\t"+line+"\n") {
			t.Errorf("the documented line %q is not in Example", line)
		}
	}
}
