package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunExitCodes(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-h"}, func(string) string { return "" }, &out, &out); code != 0 || !strings.Contains(out.String(), "ALLOT_ETCD_ENDPOINTS") {
		t.Fatalf("-h: exit %d, usage %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"-config", "../../configs/balancer.yaml", "-regions", ""}, func(string) string { return "" }, &out, &out); code != 2 ||
		!strings.Contains(out.String(), "regions is empty") {
		t.Fatalf("bad config: exit %d, %q", code, out.String())
	}
}
