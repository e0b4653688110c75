package worker

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestProtocolMismatchErrorKeepsThePgErrorReachable(t *testing.T) {
	pg := &pgconn.PgError{Code: "42883", Message: "function pgflow.ensure_flow_compiled(text, jsonb, text, jsonb) does not exist"}
	var err error = &ProtocolMismatchError{Missing: []string{ensureFlowSignature}, Err: pg}
	err = fmt.Errorf("starting worker: %w", err)
	if !errors.Is(err, ErrProtocolMismatch) {
		t.Error("not errors.Is ErrProtocolMismatch")
	}
	var got *pgconn.PgError
	if !errors.As(err, &got) || got.Code != "42883" {
		t.Errorf("PgError not reachable: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, ensureFlowSignature) || !strings.Contains(msg, "upgrade") {
		t.Errorf("message does not say what is missing and what to do: %s", msg)
	}
	if !isUndefined(err) {
		t.Error("42883 not recognised as undefined")
	}
	if isUndefined(&pgconn.PgError{Code: "23505"}) || isUndefined(errors.New("x")) {
		t.Error("other errors taken for undefined")
	}
}

func TestFlowMismatchErrorsAreTypedApart(t *testing.T) {
	var shape error = &FlowShapeMismatchError{FlowSlug: "f", Differences: []string{"Step count differs"}}
	var routing error = &FlowRoutingMismatchError{FlowSlug: "f", Differences: []string{"queue_mode differs"}}
	for _, err := range []error{shape, routing} {
		if !errors.Is(err, ErrFlowMismatch) {
			t.Errorf("%T is not ErrFlowMismatch", err)
		}
		if errors.Is(err, ErrProtocolMismatch) || errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%T matches an unrelated sentinel", err)
		}
	}
	var r *FlowRoutingMismatchError
	if errors.As(shape, &r) {
		t.Error("a shape mismatch reads as a routing mismatch")
	}
	if !strings.Contains(routing.Error(), "queue_mode differs") || !strings.Contains(shape.Error(), "Step count differs") {
		t.Error("differences missing from the messages")
	}
}
