// Command smoke is the static test binary packed into the image
// localhost/agentplane/smoke:dev by tests/cluster/smoke.sh.
//
//	smoke serve ADDR     HTTP server: GET / -> "agentplane-smoke-ok <hostname>"
//	smoke get URL        GET URL, print the body, exit 1 unless 200
//	smoke apiserver      GET /version on the in-cluster API server (kubernetes
//	                     Service, service-account token + CA), print the body
//	smoke webhook ADDR CERT KEY
//	                     HTTPS validating admission webhook: denies objects
//	                     labelled agentplane-smoke/deny=true, allows the rest
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: smoke serve ADDR | get URL | apiserver")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		addr := ":8080"
		if len(os.Args) > 2 {
			addr = os.Args[2]
		}
		err = serve(addr)
	case "get":
		if len(os.Args) < 3 {
			err = fmt.Errorf("get needs a URL")
			break
		}
		err = get(http.DefaultClient, os.Args[2], nil)
	case "apiserver":
		err = apiserver()
	case "webhook":
		if len(os.Args) < 5 {
			err = fmt.Errorf("webhook needs ADDR CERT KEY")
			break
		}
		err = webhook(os.Args[2], os.Args[3], os.Args[4])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "smoke:", err)
		os.Exit(1)
	}
}

func serve(addr string) error {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "agentplane-smoke-ok %s\n", host)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("serving on %s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func get(c *http.Client, url string, hdr http.Header) error {
	c.Timeout = 10 * time.Second
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	fmt.Printf("%s", body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

func apiserver() error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST/PORT not set")
	}
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no CA certificate in %s/ca.crt", saDir)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	hdr := http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(token))}}
	return get(c, "https://"+net.JoinHostPort(host, port)+"/version", hdr)
}

// admissionReview is the subset of admission.k8s.io/v1 AdmissionReview used here.
type admissionReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID    string `json:"uid"`
		Object struct {
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"object"`
	} `json:"request,omitempty"`
	Response *admissionResponse `json:"response,omitempty"`
}

type admissionResponse struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
	Status  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"status,omitempty"`
}

func webhook(addr, cert, key string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/validate", func(w http.ResponseWriter, r *http.Request) {
		var review admissionReview
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "bad AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := &admissionResponse{UID: review.Request.UID, Allowed: true}
		md := review.Request.Object.Metadata
		if md.Labels["agentplane-smoke/deny"] == "true" {
			resp.Allowed = false
			resp.Status = &struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}{Code: http.StatusForbidden, Message: "agentplane-smoke webhook denied " + md.Name}
		}
		fmt.Printf("review %s %s allowed=%v\n", review.Request.UID, md.Name, resp.Allowed)
		out := admissionReview{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview", Response: resp}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	fmt.Printf("webhook on %s\n", addr)
	return srv.ListenAndServeTLS(cert, key)
}
