package rules

import "testing"

func TestNormalizeEndpoint(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"POST /v1/login", "POST /v1/login"},
		{"POST /v1/login/", "POST /v1/login"},
		{"POST //v1/login", "POST /v1/login"},
		{"POST /v1/./login", "POST /v1/login"},
		{"POST /V1/login", "POST /v1/login"},
		{"POST /v1/%6cogin", "POST /v1/login"},
		{"POST /v1/%6Cogin", "POST /v1/login"},
		{"POST /v1/login;x", "POST /v1/login"},
		{"POST /v1/x/../login", "POST /v1/login"},
		{"POST /../../v1/login", "POST /v1/login"},
		{"post /v1/login?a=1", "POST /v1/login"},
		{"GET /v1/a%2fb", "GET /v1/a%2Fb"},
		{"GET /", "GET /"},
		{"GET //", "GET /"},
		{"/v1/login/", "/v1/login"},
		{"GET", "GET"},
		{"", ""},
		{"GET /v1/a%", "GET /v1/a%"},
	} {
		if got := NormalizeEndpoint(tc.in); got != tc.want {
			t.Errorf("NormalizeEndpoint(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := NormalizeEndpoint(tc.want); got != tc.want {
			t.Errorf("not idempotent: NormalizeEndpoint(%q) = %q", tc.want, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { NormalizeEndpoint("GET /v1/search") }); n != 0 {
		t.Errorf("normal endpoint: %v allocations", n)
	}
}
