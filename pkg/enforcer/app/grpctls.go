package app

import (
	"crypto/tls"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// grpcTLS is the gRPC server's transport option: TLS as listen.grpc_tls says (with the
// client certificate's name checked against listen.grpc_client_san), or none.
func (a *App) grpcTLS() (grpc.ServerOption, error) {
	tc, err := grpcServerTLS(a.cfg.Listen)
	if err != nil || tc == nil {
		return grpc.EmptyServerOption{}, err
	}
	return grpc.Creds(credentials.NewTLS(tc)), nil
}

// grpcServerTLS builds listen.grpc_tls; nil when off.
func grpcServerTLS(l ListenConfig) (*tls.Config, error) {
	tc, err := l.GRPCTLS.Build()
	if err != nil {
		return nil, fmt.Errorf("app: listen.grpc_tls: %w", err)
	}
	if tc != nil && l.GRPCClientSAN != "" {
		san := l.GRPCClientSAN
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no client certificate")
			}
			if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
				return fmt.Errorf("client certificate: %w (listen.grpc_client_san)", err)
			}
			return nil
		}
	}
	return tc, nil
}
