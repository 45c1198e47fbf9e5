package lifecycle

import (
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestMain fails the package if its tests leave Redis keys behind.
func TestMain(m *testing.M) { testenv.Main(m) }
