// Command reference runs tool-call sequences for the conformance suite
// (tests/conformance/), either through the reference implementation of the
// agent_toolset_20260401 tools -- anthropic-sdk-go's tools/agenttoolset,
// pinned in go.mod -- in-process, or through agentplane's runner over its
// gRPC Unix socket with one persistent connection. Both modes read the same
// JSON on stdin and print the same JSON on stdout, so the driver compares
// like with like and the latency figures time the same calls.
//
//	reference ref    --workdir DIR  < calls.json
//	reference runner --socket PATH  < calls.json
//
// stdin:  {"calls": [{"tool": "bash", "input": "<raw input JSON text>"}, ...],
//
//	"call_timeout_ms": 20000, "repeat": 1}
//
// stdout: {"results": [{"content": "...", "is_error": false, "ns": 123,
//
//	"status": ""}, ...]}
//
// content is the text the tool produced. For an error result the reference
// hands the tool runner a *ToolError whose Content this is (the SDK's tool
// runner then prefixes "Error: " when it builds the tool_result block, which
// is the executor's business on our side, not the runner's). A gRPC status
// from the runner (a refusal or a fault, never a tool result) is reported in
// status with content empty. repeat > 1 runs the whole sequence that many
// times on the same toolset (used by the latency figures).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/tools/agenttoolset"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

type call struct {
	Tool  string `json:"tool"`
	Input string `json:"input"`
	// ID is the call id sent to the runner; empty means one is generated.
	ID string `json:"id,omitempty"`
}

type request struct {
	Calls         []call `json:"calls"`
	CallTimeoutMs int64  `json:"call_timeout_ms"`
	Repeat        int    `json:"repeat"`
}

type result struct {
	Content string `json:"content"`
	IsError bool   `json:"is_error"`
	Ns      int64  `json:"ns"`
	Status  string `json:"status,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: reference ref --workdir DIR | runner --socket PATH  (calls JSON on stdin)")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	workdir := fs.String("workdir", "", "workdir of the reference toolset (ref)")
	socket := fs.String("socket", "", "the runner's Unix socket (runner)")
	_ = fs.Parse(os.Args[2:])

	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fatal("read calls: %v", err)
	}
	if req.CallTimeoutMs <= 0 {
		req.CallTimeoutMs = 20_000
	}
	if req.Repeat <= 0 {
		req.Repeat = 1
	}
	timeout := time.Duration(req.CallTimeoutMs) * time.Millisecond

	var run func(ctx context.Context, n int, c call) result
	switch mode {
	case "ref":
		if *workdir == "" {
			fatal("ref needs --workdir")
		}
		tools := agenttoolset.BetaAgentToolset20260401(&agenttoolset.AgentToolContext{Workdir: *workdir})
		defer agenttoolset.CloseAll(tools)
		byName := map[string]anthropic.BetaTool{}
		for _, t := range tools {
			byName[t.Name()] = t
		}
		run = func(ctx context.Context, _ int, c call) result {
			return runRef(ctx, byName, c)
		}
	case "runner":
		if *socket == "" {
			fatal("runner needs --socket")
		}
		conn, err := grpc.NewClient("unix:"+*socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			fatal("dial %s: %v", *socket, err)
		}
		defer conn.Close()
		pid := os.Getpid()
		run = func(ctx context.Context, n int, c call) result {
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("conf-%d-%d", pid, n)
			}
			return runRunner(ctx, conn, id, c)
		}
	default:
		fatal("unknown mode %q", mode)
	}

	var out struct {
		Results []result `json:"results"`
	}
	n := 0
	for r := 0; r < req.Repeat; r++ {
		for _, c := range req.Calls {
			n++
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			res := run(ctx, n, c)
			cancel()
			out.Results = append(out.Results, res)
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fatal("write results: %v", err)
	}
}

func fatal(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "reference: "+format+"\n", a...)
	os.Exit(1)
}

// runRef runs one call the way the SDK's tool runner does, flattening the
// text blocks; an error's text is the tool's (without the runner's "Error: ").
func runRef(ctx context.Context, tools map[string]anthropic.BetaTool, c call) result {
	t, ok := tools[c.Tool]
	if !ok {
		// The reference has no dispatcher; a made-up name never reaches a tool.
		return result{Status: "no such tool in the reference"}
	}
	start := time.Now()
	blocks, err := t.Execute(ctx, json.RawMessage(c.Input))
	ns := time.Since(start).Nanoseconds()
	if err != nil {
		var te *agenttoolset.ToolError
		if errors.As(err, &te) {
			return result{Content: te.Content, IsError: true, Ns: ns}
		}
		return result{Content: err.Error(), IsError: true, Ns: ns}
	}
	var sb strings.Builder
	for _, b := range blocks {
		if b.OfText != nil {
			sb.WriteString(b.OfText.Text)
		}
	}
	return result{Content: sb.String(), Ns: ns}
}

// runRunner sends agentplane.runner.v1.Runner/Run over the persistent
// connection. The two messages are four scalar fields, so they are encoded
// with protowire directly instead of generated code.
func runRunner(ctx context.Context, conn *grpc.ClientConn, id string, c call) result {
	var reqb []byte
	reqb = protowire.AppendTag(reqb, 1, protowire.BytesType)
	reqb = protowire.AppendString(reqb, id)
	reqb = protowire.AppendTag(reqb, 2, protowire.BytesType)
	reqb = protowire.AppendString(reqb, c.Tool)
	reqb = protowire.AppendTag(reqb, 3, protowire.BytesType)
	reqb = protowire.AppendString(reqb, c.Input)
	reqb = protowire.AppendTag(reqb, 4, protowire.VarintType)
	reqb = protowire.AppendVarint(reqb, 1) // confirmed: policies are not under test
	in := rawMsg(reqb)
	var resp rawMsg
	start := time.Now()
	err := conn.Invoke(ctx, "/agentplane.runner.v1.Runner/Run", &in, &resp)
	ns := time.Since(start).Nanoseconds()
	if err != nil {
		st := status.Convert(err)
		return result{Ns: ns, Status: st.Code().String() + ": " + st.Message()}
	}
	res := result{Ns: ns}
	b := []byte(resp)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return result{Ns: ns, Status: "undecodable response"}
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return result{Ns: ns, Status: "undecodable response"}
			}
			res.Content = string(v)
			b = b[m:]
		case num == 2 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return result{Ns: ns, Status: "undecodable response"}
			}
			res.IsError = v != 0
			b = b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return result{Ns: ns, Status: "undecodable response"}
			}
			b = b[m:]
		}
	}
	return res
}

// rawMsg is a message already in wire form.
type rawMsg []byte

// rawCodec passes rawMsg through as the wire bytes. It is forced per call,
// and its name is the content-subtype the server expects.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*rawMsg)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *m, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMsg)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*m = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }
