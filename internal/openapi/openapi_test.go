package openapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
)

// TestDocumentIsValid checks the document against the OpenAPI 3.1
// specification's own schema, so a misspelt keyword or a broken $ref fails
// here rather than in a client's code generator.
func TestDocumentIsValid(t *testing.T) {
	doc, err := libopenapi.NewDocument(Document())
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got := doc.GetVersion(); got != "3.1.0" {
		t.Errorf("openapi version: got %s, want 3.1.0", got)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("build model: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("%s: %s", e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				t.Errorf("  %s at %s (%s)", se.Reason, se.FieldPath, se.KeywordLocation)
			}
		}
	}
}

func TestServe(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.GET(Path, Serve)
	w := httptest.NewRecorder()
	e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, Path, nil))
	if w.Code != http.StatusOK {
		t.Fatalf("status: got %d, want 200", w.Code)
	}
	if got := w.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type: got %q, want application/json", got)
	}
	if w.Body.String() != string(Document()) {
		t.Errorf("body is not the document")
	}
}
