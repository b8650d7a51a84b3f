package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
)

const certsUsage = `usage: balancer certs [-dir bin/certs] [-regions us-east,eu-west,ap-south] [-hosts NAME,...] [-validity 8760h] [-force]

Writes the certificates that authenticate usage reports (mutual TLS, pkg/certs) under -dir:
  ca.pem, ca-key.pem                         the CA both sides verify the other against
  balancer.pem, balancer-key.pem             the balancer replicas' server certificate
                                             (localhost, 127.0.0.1, ::1 and -hosts)
  enforcer-<region>.pem, -<region>-key.pem   each region's enforcers' client certificate,
                                             URI SAN spiffe://allot/region/<region>/enforcer
A balancer takes a region's reports only from a certificate that names that region.
Run again, it keeps the CA and existing files and adds what is missing; -force replaces
all of them. configs/balancer.yaml and configs/regions/*.yaml name the default -dir's files.
Keep ca-key.pem off the hosts that serve.
`

// certsCmd is "balancer certs": the CA, the balancer's and each region's certificates.
func certsCmd(args []string, env cliEnv, now func() time.Time) int {
	fs := flag.NewFlagSet("balancer certs", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() { fmt.Fprint(env.stderr, certsUsage) }
	dir := fs.String("dir", "bin/certs", "directory to write to (made 0700)")
	regions := fs.String("regions", "us-east,eu-west,ap-south", "comma-separated regions, one client certificate each")
	hosts := fs.String("hosts", "", "comma-separated extra names or addresses of the balancer, as enforcers dial it")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the balancer's and enforcers' certificates last")
	force := fs.Bool("force", false, "replace every file, the CA too")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(env.stderr, "balancer certs: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	res, err := certs.Generate(*dir, certs.Options{Regions: split(*regions), Hosts: split(*hosts), Now: now(),
		Validity: *validity, Force: *force})
	if err != nil {
		fmt.Fprintln(env.stderr, "balancer certs:", err)
		return 1
	}
	for _, f := range res.Written {
		fmt.Fprintln(env.stdout, "wrote", f)
	}
	for _, f := range res.Kept {
		fmt.Fprintln(env.stdout, "kept ", f)
	}
	return 0
}

func split(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
