module flashattn.dev/examples/go

go 1.19

require flashattn.dev/flashattn v0.0.0

replace flashattn.dev/flashattn => ../../bindings/go
