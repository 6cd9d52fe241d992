module commitpoint/clients/go

go 1.19
