package versions

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

// derive015 builds the 0.15.x catalogs, which are not embedded, from the
// 0.16.0 catalog by undoing what the later migrations changed in the
// catalog (the rest of migrations 22 and 23 is function bodies and data
// repairs, invisible to a catalog):
//
//   - 0.15.1 = 0.16.0 without migration 23 (remove_legacy_flow_compilation):
//     ensure_flow_compiled(text, jsonb) is absent and the 3-argument
//     ensure_flow_compiled(text, jsonb, boolean) is there, as 0.14.1 has it.
//   - 0.15.0 = 0.15.1 without migration 22 (task_lifecycle_hardening):
//     step_tasks.valid_status without 'skipped' and 'cancelled', as in 0.14.1.
//
// Migration 21 (worker_start_mode: worker_functions.start_mode, its check,
// track_worker_function(text, text)) stays, which is what makes 0.15.0
// differ from 0.14.1; the package's tests derive 0.15.0 forward from 0.14.1
// too and require both derivations to agree.
func derive015(v016, v014 *catalog.Catalog) (v150, v151 *catalog.Catalog, err error) {
	v151 = v016.Clone()
	i := slices.IndexFunc(v151.Functions, func(f catalog.Function) bool {
		return f.Name == EnsureFlowCompiled016.Name && f.IdentityArguments == EnsureFlowCompiled016.IdentityArguments
	})
	old := EnsureFlowCompiled014.In(v014)
	if i < 0 || old == nil {
		return nil, nil, fmt.Errorf("deriving pgflow 0.15.1: %s or %s not in the facts' catalogs", EnsureFlowCompiled016, EnsureFlowCompiled014)
	}
	v151.Functions = slices.Delete(v151.Functions, i, i+1)
	v151.Functions = append(v151.Functions, *old)
	sortFunctions(v151.Functions)

	v150 = v151.Clone()
	st, st14 := v150.Table("step_tasks"), v014.Table("step_tasks")
	if st == nil || st14 == nil || st.Constraint("valid_status") == nil || st14.Constraint("valid_status") == nil {
		return nil, nil, fmt.Errorf("deriving pgflow 0.15.0: step_tasks.valid_status not in the facts' catalogs")
	}
	*st.Constraint("valid_status") = *st14.Constraint("valid_status")
	return v150, v151, nil
}

// sortFunctions orders functions as the catalog does: (name, identity
// arguments), bytewise (COLLATE "C").
func sortFunctions(fs []catalog.Function) {
	slices.SortFunc(fs, func(a, b catalog.Function) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.IdentityArguments, b.IdentityArguments)
	})
}
