package postboxschema_test

import (
	"errors"
	"fmt"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxschema"
)

func ExampleLoad() {
	reg, err := postboxschema.Load("testdata/schemas", &postboxschema.Options{RequireSchema: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reg.Topics())

	// Set reg as postbox.Config.Validator, and WriteTx refuses this payload
	// with the same error, its field named messages[i].payload.
	err = reg.ValidatePayload("orders.created", []byte(`{"id":"ord_7","amount":-5,"currency":"EUR"}`))
	var ve *postbox.ValidationError
	fmt.Println(errors.As(err, &ve), ve.Field)
	fmt.Println(err)

	fmt.Println(reg.ValidatePayload("audit.logged", []byte(`{}`)))
	// Output:
	// [orders.created payments.refunded users.signed_up]
	// true payload
	// postbox: invalid payload: at /amount: must be >= 0 (minimum)
	// postbox: invalid topic "audit.logged": has no schema, and schemas are required
}

func ExampleNew() {
	reg, err := postboxschema.New(map[string][]byte{
		"invoices.issued": []byte(`{
			"type": "object",
			"required": ["number", "lines"],
			"properties": {
				"number": {"type": "string"},
				"lines": {"type": "array", "minItems": 1}
			}
		}`),
	}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reg.ValidatePayload("invoices.issued", []byte(`{"number":"F-1","lines":[{"sku":"a"}]}`)))
	fmt.Println(reg.ValidatePayload("invoices.issued", []byte(`{"number":17,"lines":[]}`)))
	fmt.Println(reg.ValidatePayload("invoices.issued", []byte(`<invoice number="F-2"/>`)))
	// Output:
	// <nil>
	// postbox: invalid payload: at /lines: must have at least 1 item, has 0 (minItems); at /number: must be string, not number (type)
	// postbox: invalid payload: is not JSON: invalid character '<' looking for beginning of value (line 1, column 1)
}

func ExampleLoadError() {
	_, err := postboxschema.New(map[string][]byte{
		"orders.created": []byte(`{"type": "obj"}`),
		"orders shipped": []byte(`{}`),
	}, nil)
	var le *postboxschema.LoadError
	if errors.As(err, &le) {
		for _, p := range le.Problems {
			fmt.Println(p)
		}
	}
	// Output:
	// "orders shipped": is not a valid topic: has " " at byte 6; only ASCII letters, digits and . _ : - are allowed
	// orders.created: is not a valid schema: at /type: must match at least one schema of anyOf (must be one of "array", "boolean", "integer", "null", "number", ... | must be array, not string)
}
