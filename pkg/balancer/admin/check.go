package admin

import (
	"net/http"

	"github.com/allot-dev/allot/pkg/rules"
)

// The dry run of a rule file: checked alone, the way `enforcer rules check` does, with
// the balancer's regions; nothing is written.

// CheckRequest is the body of POST /v1/admin/check: a rule file to check, alone, the way
// `enforcer rules check` does (rules.CheckYAML), with the balancer's regions.
type CheckRequest struct {
	File string `json:"file"`
	YAML string `json:"yaml"`
}

// CheckResponse answers it: OK, or every problem.
type CheckResponse struct {
	OK       bool      `json:"ok"`
	Rules    int       `json:"rules"`
	Error    string    `json:"error,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
}

func (s *Server) check(_ http.ResponseWriter, r *http.Request, _ string) (any, error) {
	var req CheckRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	opt := s.cfg.Compile
	opt.Now = s.cfg.Clock.Now()
	if err := rules.CheckYAML([]byte(req.YAML), req.File, opt); err != nil {
		return CheckResponse{Error: err.Error(), Problems: problems(err)}, nil
	}
	set, _ := rules.ParseYAMLAt([]byte(req.YAML), req.File)
	return CheckResponse{OK: true, Rules: len(set.Rules)}, nil
}
