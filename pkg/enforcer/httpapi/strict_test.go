package httpapi

import "testing"

func TestStrictBodyAccepts(t *testing.T) {
	for _, b := range []string{
		`{"api_key":"k","plan":"pro","org":"o","endpoint":"GET /v1/x","ip":"1.2.3.4","hits":2}`,
		`{"api_key":"\ud83d\ude00 \u00e9 \"x\" \\"}`,
		` {"api_key" : "k" } `,
		`{"bogus":{"api_key":1,"api_key":2}}`, // unknown keys are the decoder's to refuse
	} {
		if err := strictBody([]byte(b)); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
	body := []byte(`{"api_key":"k_acme_live_1","endpoint":"GET /v1/search","ip":"203.0.113.9"}`)
	if n := testing.AllocsPerRun(100, func() { strictBody(body) }); n != 0 {
		t.Errorf("strictBody: %v allocations", n)
	}
}
