package contract

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeMembers(t *testing.T) {
	m, err := DecodeMembers([]byte(`{"leader_rev": 7, "regions": {"us-east": ["us-east-0", ""], "eu-west": []}}`))
	if err != nil || m.LeaderRev != 7 || len(m.Regions["us-east"]) != 2 {
		t.Fatalf("valid members: %+v, %v", m, err)
	}
	for _, c := range []struct{ in, want string }{
		{`{"leader_rev": -1}`, "negative leader_rev"},
		{`{"regions": {"": ["a"]}}`, "empty region name"},
		{`{"regions": {"us-east": ["` + strings.Repeat("x", MaxMemberID+1) + `"]}}`, "region \"us-east\": enforcer id of 513 bytes"},
		{`{"regions": [1]}`, "members:"},
	} {
		_, err := DecodeMembers([]byte(c.in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("DecodeMembers(%.40s): %v, want ErrInvalid naming %q", c.in, err, c.want)
		}
	}
}
