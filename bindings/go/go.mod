module flashattn.dev/flashattn

go 1.19
