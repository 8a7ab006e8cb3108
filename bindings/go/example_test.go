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
