package validate

import (
	"strings"
	"testing"
)

// The clients' Service must send its traffic to --listen (the entity
// API): Check only checked that a target port is declared by the
// container, so a dhtkv-client port aimed at the admin port passed, and
// clients would get 404 (or 401) from the admin listener for every
// request, with the admin endpoints (/cluster, /snapshot, /debug/pprof)
// exposed through the clients' Service.
func TestClientServiceOnTheAdminPort(t *testing.T) {
	f := files(t)
	old := "  name: dhtkv-client\n  labels:\n    app.kubernetes.io/name: dhtkv\nspec:\n  selector:\n    app.kubernetes.io/name: dhtkv\n  ports:\n    - name: api\n      port: 8080\n      targetPort: api\n"
	if strings.Count(f["service.yaml"], old) != 1 {
		t.Fatalf("service.yaml changed")
	}
	f["service.yaml"] = strings.Replace(f["service.yaml"], old, strings.Replace(old, "targetPort: api", "targetPort: admin", 1), 1)
	b, err := Render(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(b, binary(t), t.TempDir()); err == nil {
		t.Fatal("dhtkv-client's port 8080 targets the admin listener (6060), and Check passes")
	}
}
