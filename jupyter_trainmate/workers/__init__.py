"""Running a cell in another process: what travels there (`payload`) and back (`results`)."""
