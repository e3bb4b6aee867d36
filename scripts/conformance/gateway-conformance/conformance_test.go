// The upstream Gateway API conformance suite's own entry point, compiled into one test
// binary by scripts/conformance/gateway-conformance.sh (sigs.k8s.io/gateway-api/conformance at the
// version pinned in go.mod). Nothing of Sluice is here.
package conformance_test

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
