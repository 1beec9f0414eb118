/* kvshim proto: placeholder, being implemented. */
