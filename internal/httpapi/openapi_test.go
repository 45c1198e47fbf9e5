package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/flashsale/flashsale/internal/openapi"
)

// TestOpenAPIErrorCodes keeps the OpenAPI document's error codes equal to
// the ones Classify answers, and every status Classify answers documented
// by some operation (405 excepted: it answers a method no operation has).
func TestOpenAPIErrorCodes(t *testing.T) {
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas struct {
				ErrorCode struct {
					Enum []string `json:"enum"`
				} `json:"ErrorCode"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapi.Document(), &doc); err != nil {
		t.Fatalf("decode the document: %v", err)
	}
	want := []string{"invalid_request", internalError.code}
	for _, s := range mapping {
		want = append(want, s.code)
	}
	got := doc.Components.Schemas.ErrorCode.Enum
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("ErrorCode enum: got %v, want %v", got, want)
	}

	documented := map[string]bool{}
	for _, item := range doc.Paths {
		for method, raw := range item {
			if method == "parameters" {
				continue
			}
			var op struct {
				Responses map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("decode an operation: %v", err)
			}
			for status := range op.Responses {
				documented[status] = true
			}
		}
	}
	for _, s := range append(slices.Clone(mapping), internalError) {
		if s.status != http.StatusMethodNotAllowed && !documented[strconv.Itoa(s.status)] {
			t.Errorf("%s: status %d is documented by no operation", s.code, s.status)
		}
	}
}
