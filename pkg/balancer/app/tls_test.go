package app

import (
	"strings"
	"testing"
)

func TestTLSBuildRefusesHalfConfigs(t *testing.T) {
	for _, tc := range []struct {
		build func() error
		want  string
	}{
		{func() error { _, err := (ServerTLSConfig{CertFile: "c.pem"}).Build(); return err }, "tls.enabled is false"},
		{func() error {
			_, err := (ServerTLSConfig{Enabled: true, CertFile: "nope.pem", KeyFile: "nope.pem"}).Build()
			return err
		}, "server certificate"},
		{func() error { _, err := (TLSConfig{CAFile: "ca.pem"}).Build(); return err }, "tls.enabled is false"},
		{func() error { _, err := (TLSConfig{Enabled: true, CertFile: "c.pem"}).Build(); return err }, "must be set together"},
		{func() error { _, err := (TLSConfig{Enabled: true, CAFile: "nope.pem"}).Build(); return err }, "while reading ca_file"},
	} {
		if err := tc.build(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one naming %q", err, tc.want)
		}
	}
	if c, err := (TLSConfig{}).Build(); c != nil || err != nil {
		t.Fatalf("off: %v %v", c, err)
	}
}
